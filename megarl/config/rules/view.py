"""Read-only access to checked config values for the cross-key rules."""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable, Iterator
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf


def value_at(cfg: DictConfig, key: str) -> Any:
    """The plain (resolved, container-free) value at dotted `key`; None when absent."""
    value = OmegaConf.select(cfg, key, default=None)
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


class Skip(Exception):
    """A rule needs a key that is already reported as bad: skip the rule."""


def has_module(name: str) -> bool:
    """Whether `name` is importable in this process (no import is done)."""
    return importlib.util.find_spec(name) is not None


class View:
    """Values of a config whose schema check has run; keys in `bad` raise `Skip`.

    `installed(module)`: whether the machines of the run can import `module` (this process's
    packages; a plan for GPUs made without one judges the GPU stack megarl ships). `files`: False
    where data files, weights and tokenizers need not exist yet (a plan): the rules marked
    `needs_files` are skipped.
    """

    def __init__(self, cfg: DictConfig, bad: set[str], *, installed: Callable[[str], bool] = has_module,
                 files: bool = True):
        self.cfg = cfg
        self.bad = bad
        self.installed = installed
        self.files = files

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


FILE_CHECKS: list[str] = []  # what each `needs_files` rule checks, in the plan's words


def needs_files(what: str) -> Callable[[Callable[..., Iterator[Any]]], Callable[..., Iterator[Any]]]:
    """Mark a rule that needs data files, weights or tokenizers on disk: skipped when
    `View.files` is false; `what` joins FILE_CHECKS (the plan names the checks it skipped)."""
    FILE_CHECKS.append(what)

    def wrap(rule: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
        @functools.wraps(rule)
        def checked(v: View, *args: Any) -> Iterator[Any]:
            if v.files:
                yield from rule(v, *args)

        return checked

    return wrap
