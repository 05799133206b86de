"""Name -> function registries for config strings.

Each registry rejects unknown names with the config key and the list of valid names, so
a typo in the yaml fails with the key even where the config validator did not run (it checks
against the same names, kept in `megarl.config.names`).
"""

from __future__ import annotations

from collections.abc import Callable, KeysView
from typing import Any, Generic, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class Registry(Generic[F]):
    """A named table of functions; `config_key` is named in error messages."""

    def __init__(self, kind: str, config_key: str):
        self.kind = kind
        self.config_key = config_key
        self._table: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        def deco(fn: F) -> F:
            if name in self._table and self._table[name] is not fn:
                raise ValueError(f"{self.kind} '{name}' is already registered")
            self._table[name] = fn
            return fn

        return deco

    def get(self, name: str) -> F:
        if name not in self._table:
            raise ValueError(
                f"Unknown {self.kind} '{name}' ({self.config_key}). Valid: {sorted(self._table)}"
            )
        return self._table[name]

    def names(self) -> KeysView[str]:
        """Live view of registered names (supports `in`, iteration, `sorted`)."""
        return self._table.keys()


def check_choice(value: str, valid: Any, kind: str, config_key: str) -> str:
    """Return `value` if it is in `valid`, else raise naming the key and the valid list."""
    if value not in valid:
        raise ValueError(f"Unknown {kind} '{value}' ({config_key}). Valid: {sorted(valid)}")
    return value
