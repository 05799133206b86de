"""The resolved config as typed objects: `MegaRLConfig` and its nested dataclasses.

Workers, the trainer and algorithms receive these (attribute access, the yaml's key names). Built
from a config that `validate_config` accepted, so every value already has its schema type; keys
megarl does not implement (compat.py) are not carried.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

from megarl.config.schema import MegaRLConfig
from megarl.config.walk import schema_fields

T = TypeVar("T")


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
    """`MegaRLConfig` from a validated (and preferably resolved) DictConfig."""
    return to_typed(MegaRLConfig, OmegaConf.to_container(cfg, resolve=True))


def to_dict(obj: Any) -> Any:
    """Plain nested dict of a typed config (for logging, checkpoints, hashing). Reads the fields
    without recording them: a dump is not a use (see megarl.config.spec.record_reads_to)."""
    if not dataclasses.is_dataclass(obj):
        return obj
    return {f.name: to_dict(object.__getattribute__(obj, f.name)) for f in dataclasses.fields(obj)}


def section_of(cfg: MegaRLConfig, dotted: str) -> Any:
    """The typed section at `dotted` (e.g. "actor_rollout_ref.rollout")."""
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node
