"""Values of the verl keys megarl accepts without implementing them (verl_compat.accepted_keys).

A `refuse` key changed from its yaml default (verl's) is an error naming the key and the reason; an
`ignore` key changed is reported once by `compat_notices` (main_ppo prints it). The comparison is on
raw (unresolved) values against the raw yaml defaults, so a default like
`${oc.select:actor_rollout_ref.actor.megatron.seed,42}` is not "changed" when its target is; a
value given in its place is changed only when it differs from what that default resolves to (a
script's `ref.megatron.use_mbridge=True` beside the actor's True mirrors it: no second notice).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

from omegaconf import DictConfig, OmegaConf

from megarl.config.errors import Issue
from megarl.config.files import CONFIG_YAML
from megarl.config.rules.view import View
from megarl.config.verl_compat.accepted_keys import CompatRule, rule_for

_MISSING = object()


@functools.cache
def _yaml_raw() -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.load(CONFIG_YAML), resolve=False)


def _leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict) and node:
        for key, value in node.items():
            if key != "_target_":
                yield from _leaves(value, f"{prefix}{key}.")
    else:
        yield prefix[:-1], node


def _raw_at(tree: dict[str, Any], key: str) -> Any:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def changed_compat_keys(cfg: DictConfig) -> Iterator[tuple[str, Any, Any, CompatRule]]:
    """(key, value, verl default, rule) for every compat leaf whose raw value differs from the yaml."""
    defaults = _yaml_raw()
    for key, value in _leaves(OmegaConf.to_container(cfg, resolve=False)):
        rule = rule_for(key)
        if rule is None:
            continue
        default = _raw_at(defaults, key)
        if default is _MISSING:  # a new key under a compat section (e.g. +global_profiler.x=1)
            default = None
        if value != default and not _mirrors_its_default(cfg, key, value, default):
            yield key, value, default, rule


def _mirrors_its_default(cfg: DictConfig, key: str, value: Any, default: Any) -> bool:
    """Whether `value` equals what the interpolated yaml `default` of `key` resolves to in `cfg`."""
    if not (isinstance(default, str) and "${" in default):
        return False
    probe = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    OmegaConf.update(probe, key, default, force_add=True)
    return OmegaConf.select(probe, key) == OmegaConf.select(cfg, key)


def refused_compat_keys(v: View) -> Iterator[Issue]:
    for key, value, default, rule in changed_compat_keys(v.cfg):
        if rule.kind == "refuse" and value not in rule.accepted:
            shown = "null" if default is None else default
            accepted = f"verl's default {shown}" + "".join(f" or {a}" for a in rule.accepted)
            yield Issue(key, value, f"not supported: {rule.reason}",
                        f"remove the override ({accepted} {'are the values' if rule.accepted else 'is the only value'} megarl accepts)")


def compat_notices(cfg: DictConfig) -> list[str]:
    """One line per changed `ignore` key: it is accepted but has no effect in megarl."""
    return [f"{key}={value!r} has no effect in megarl: {rule.reason}"
            for key, value, _, rule in changed_compat_keys(cfg) if rule.kind == "ignore"]


RULES = (refused_compat_keys,)
