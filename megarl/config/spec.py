"""Field metadata for the schema dataclasses: ranges, allowed names, path keys.

The yaml (megarl/configs/megatron/ppo_megatron_trainer.yaml) holds every default value; the
dataclasses hold types and constraints only, so a schema field has no default.
"""

from __future__ import annotations

import os

from collections.abc import Callable, Iterable
from dataclasses import field
from typing import Any

Choices = Iterable[str] | Callable[[], Iterable[str]]


def spec(
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    choices: Choices | None = None,
    path: bool = False,
    note: str | None = None,
) -> Any:
    """A schema field with constraints (checked only when the value is not null).

    ge/gt/le/lt: numeric bounds. choices: allowed strings (or a zero-argument callable
    returning them, for live registries); for a list field every item is checked.
    path: a filesystem path; `resolve_config` expands `~` in it.
    note: extra text for a choices error (e.g. why other verl values are not supported).
    """
    meta = {"ge": ge, "gt": gt, "le": le, "lt": lt, "choices": choices, "path": path, "note": note}
    return field(metadata={k: v for k, v in meta.items() if v is not None and v is not False})


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
    """Base of the schema dataclasses; `megarl.config.typed.to_typed` sets `_megarl_key` (the
    section's dotted prefix) on each instance so reads can be recorded."""

    def __getattribute__(self, name: str) -> Any:
        value = object.__getattribute__(self, name)
        if _READS_FILE is not None and not name.startswith("_") and not isinstance(value, Section) and not callable(value):
            prefix = object.__getattribute__(self, "__dict__").get("_megarl_key")
            if prefix is not None:
                _record(prefix + name)
        return value
