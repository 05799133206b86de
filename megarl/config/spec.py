"""Field metadata for the schema dataclasses: ranges, allowed names, path keys.

The yaml (configs/megatron/ppo_megatron_trainer.yaml) holds every default value; the
dataclasses hold types and constraints only, so a schema field has no default.
"""

from __future__ import annotations

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
