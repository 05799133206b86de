"""The reader: a validated config as the typed objects the run receives (`MegaRLConfig` and its
nested dataclasses, attribute access by the yaml's key names).

`typed_config` resolves the composed DictConfig (`resolve_config`: interpolations, `~` in paths, a
single logger as a list) and builds the typed tree from it; nothing changes it afterwards. Keys megarl
does not implement (verl_compat) are not carried.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

from megarl.config.schema.field import iter_schema_keys, schema_fields
from megarl.config.schema.root import MegaRLConfig

T = TypeVar("T")


def resolve_config(cfg: DictConfig) -> DictConfig:
    """A resolved copy: interpolations replaced by values and `~` expanded in path keys.

    `trainer.logger` given as one string (`trainer.logger=console`) becomes a list.
    """
    out = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    if isinstance(OmegaConf.select(out, "trainer.logger", default=None), str):
        OmegaConf.update(out, "trainer.logger", [out.trainer.logger])
    for key, _, meta in iter_schema_keys(MegaRLConfig):
        if not meta.get("path"):
            continue
        value = OmegaConf.select(out, key, default=None)
        if isinstance(value, str):
            OmegaConf.update(out, key, os.path.expanduser(value))
        elif value is not None and OmegaConf.is_list(value):
            OmegaConf.update(out, key, [os.path.expanduser(v) if isinstance(v, str) else v for v in value])
    return out


def to_typed(cls: type[T], values: dict[str, Any], prefix: str = "") -> T:
    """Instance of schema dataclass `cls` from plain `values` (sections become nested dataclasses);
    `prefix` is the section's dotted key (recorded reads name the full key)."""
    kwargs = {}
    for name, (tp, _) in schema_fields(cls).items():
        value = values[name]
        kwargs[name] = to_typed(tp, value, f"{prefix}{name}.") if dataclasses.is_dataclass(tp) else value
    obj = cls(**kwargs)
    object.__setattr__(obj, "_megarl_key", prefix)
    return obj


def typed_config(cfg: DictConfig) -> MegaRLConfig:
    """`MegaRLConfig` of a validated DictConfig (resolved here)."""
    return typed_of_resolved(resolve_config(cfg))


def typed_of_resolved(resolved: DictConfig) -> MegaRLConfig:
    """`MegaRLConfig` of a validated config that `resolve_config` already resolved (for callers that keep both)."""
    return to_typed(MegaRLConfig, OmegaConf.to_container(resolved))


def to_dict(obj: Any) -> Any:
    """Plain nested dict of a typed config (for logging, checkpoints, hashing). Reads the fields
    without recording them: a dump is not a use (see megarl.config.schema.field.record_reads_to)."""
    if not dataclasses.is_dataclass(obj):
        return obj
    return {f.name: to_dict(object.__getattribute__(obj, f.name)) for f in dataclasses.fields(obj)}


def value_at(cfg: MegaRLConfig, dotted: str) -> Any:
    """The typed value at dotted key `dotted` (e.g. "data.train_files"), for messages that show a key
    with its value; None when `dotted` is not a key of the schema."""
    node: Any = cfg
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(node) or part not in {f.name for f in dataclasses.fields(node)}:
            return None
        node = getattr(node, part)
    return node


def replaced(section: T, **changes: Any) -> T:
    """A copy of the typed `section` with `changes`, for a value only the run knows (the typed
    config itself stays as validated); reads of the copy are recorded under the same key."""
    out = dataclasses.replace(section, **changes)
    object.__setattr__(out, "_megarl_key", object.__getattribute__(section, "__dict__").get("_megarl_key"))
    return out
