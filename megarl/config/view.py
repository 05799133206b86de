"""Read-only access to checked config values for the cross-key rules."""

from __future__ import annotations

import os
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf


def value_at(cfg: DictConfig, key: str) -> Any:
    """The plain (resolved, container-free) value at dotted `key`; None when absent."""
    value = OmegaConf.select(cfg, key, default=None)
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


class Skip(Exception):
    """A rule needs a key that is already reported as bad: skip the rule."""


class View:
    """Values of a config whose schema check has run; keys in `bad` raise `Skip`."""

    def __init__(self, cfg: DictConfig, bad: set[str]):
        self.cfg = cfg
        self.bad = bad

    def get(self, key: str) -> Any:
        parts = key.split(".")
        if any(".".join(parts[: i + 1]) in self.bad for i in range(len(parts))):
            raise Skip(key)
        value = OmegaConf.select(self.cfg, key, throw_on_missing=True)
        if isinstance(value, (DictConfig, ListConfig)):
            return OmegaConf.to_container(value, resolve=True)
        return value

    def path(self, key: str) -> str | None:
        """A path-valued key with `~` expanded (None stays None)."""
        value = self.get(key)
        return None if value is None else os.path.expanduser(value)

    def world_size(self) -> int:
        return self.get("trainer.nnodes") * self.get("trainer.n_gpus_per_node")
