"""Field metadata for the schema dataclasses (ranges, allowed names, path keys), the walk over a
schema's fields, and the `Section` base that can record which keys a run reads.

The yaml (megarl/configs/megatron/ppo_megatron_trainer.yaml) holds every default value; the
dataclasses hold types and constraints only, so a schema field has no default.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import typing
from collections.abc import Iterator, Mapping
from dataclasses import field
from typing import Any


def spec(
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    choices: tuple[str, ...] | None = None,
    path: bool = False,
    note: str | None = None,
) -> Any:
    """A schema field with constraints (checked only when the value is not null).

    ge/gt/le/lt: numeric bounds. choices: allowed strings (megarl.config.names); for a list field
    every item is checked.
    path: a filesystem path; `resolve_config` expands `~` in it.
    note: extra text for a choices error (e.g. why other verl values are not supported).
    """
    meta = {"ge": ge, "gt": gt, "le": le, "lt": lt, "choices": choices, "path": path, "note": note}
    return field(metadata={k: v for k, v in meta.items() if v is not None and v is not False})


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def schema_fields(cls: type) -> dict[str, tuple[Any, Mapping[str, Any]]]:
    """name -> (type, metadata) for a schema dataclass."""
    hints = _hints(cls)
    return {f.name: (hints[f.name], f.metadata) for f in dataclasses.fields(cls)}


def iter_schema_keys(cls: type, prefix: str = "") -> Iterator[tuple[str, Any, Mapping[str, Any]]]:
    """Every leaf key of the schema as (dotted key, type, metadata)."""
    for name, (tp, meta) in schema_fields(cls).items():
        key = f"{prefix}{name}"
        if dataclasses.is_dataclass(tp):
            yield from iter_schema_keys(tp, key + ".")
        else:
            yield key, tp, meta


def _all_paths(cls: type) -> tuple[str, ...]:
    out: list[str] = []
    for name, (tp, _) in schema_fields(cls).items():
        out.append(name)
        if dataclasses.is_dataclass(tp):
            out += [f"{name}.{sub}" for sub in _all_paths(tp)]
    return tuple(out)


@functools.cache
def all_schema_paths(root: type) -> tuple[str, ...]:
    """Every key (leaf or section) of the schema as a dotted path."""
    return _all_paths(root)


# ---------------------------------------------------------------- which keys a run reads
# With MEGARL_CONFIG_READS=<file> (or after `record_reads_to`), every process appends each typed key
# it reads (once) to <file>.<pid>; tests/trainer/test_e2e_cpu.py checks that runs read every key.
_READS_FILE = os.environ.get("MEGARL_CONFIG_READS")
_SEEN: set[str] = set()


def record_reads_to(path: str | None) -> None:
    """Record reads of typed keys in this process and (through the environment) in workers it starts."""
    global _READS_FILE
    _READS_FILE = path
    if path is None:
        os.environ.pop("MEGARL_CONFIG_READS", None)
    else:
        os.environ["MEGARL_CONFIG_READS"] = path


def _record(key: str) -> None:
    if key not in _SEEN:
        _SEEN.add(key)
        with open(f"{_READS_FILE}.{os.getpid()}", "a") as out:
            out.write(key + "\n")


class Section:
    """Base of the schema dataclasses; `megarl.config.read.to_typed` sets `_megarl_key` (the
    section's dotted prefix) on each instance so reads can be recorded."""

    def __getattribute__(self, name: str) -> Any:
        value = object.__getattribute__(self, name)
        if _READS_FILE is not None and not name.startswith("_") and not isinstance(value, Section) and not callable(value):
            prefix = object.__getattribute__(self, "__dict__").get("_megarl_key")
            if prefix is not None:
                _record(prefix + name)
        return value
