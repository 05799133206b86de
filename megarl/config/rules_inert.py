"""verl keys megarl accepts (so verl command lines carry over) but has nothing to apply
them to yet: left at their yaml default they are harmless; changed, they would be
silently ignored, so a changed value is an error naming the reason.

The comparison is on the raw (unresolved) values of the composed config against the
raw yaml defaults, so a default like `${actor_rollout_ref.model.path}` is not "changed"
just because the model path is.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

from omegaconf import DictConfig, OmegaConf

from megarl.config.errors import Issue
from megarl.config.view import View

_NO_RM = "learned reward models are not implemented in megarl yet (reward_model.enable must stay false)"
_NO_MULTI_TURN = "multi-turn (tool) rollouts are not implemented in megarl yet"

# dotted key or section -> why it has no effect
INERT_KEYS: dict[str, str] = {
    "data.return_raw_input_ids": "only a learned reward model with its own chat template uses raw input ids; " + _NO_RM,
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": _NO_MULTI_TURN,
    "actor_rollout_ref.rollout.multi_turn.max_user_turns": _NO_MULTI_TURN,
    "actor_rollout_ref.rollout.multi_turn.tool_config_path": _NO_MULTI_TURN,
    "reward_model.model.input_tokenizer": _NO_RM,
    "reward_model.model.trust_remote_code": _NO_RM,
    "reward_model.megatron": _NO_RM,
    "reward_model.micro_batch_size_per_gpu": _NO_RM,
    "reward_model.max_length": _NO_RM,
}


@functools.cache
def _yaml_raw() -> DictConfig:
    from megarl.config.load import CONFIG_DIR, CONFIG_NAME

    return OmegaConf.load(f"{CONFIG_DIR}/{CONFIG_NAME}.yaml")


def _raw(cfg: DictConfig, key: str) -> Any:
    node = OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)
    if OmegaConf.is_config(node):
        return OmegaConf.to_container(node, resolve=False)
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
    if OmegaConf.is_dict(parent) and leaf in parent:
        return OmegaConf.to_container(parent, resolve=False)[leaf]
    return node


def changed_inert_keys(v: View) -> Iterator[Issue]:
    defaults = _yaml_raw()
    for key, reason in INERT_KEYS.items():
        if any(key == b or key.startswith(b + ".") or b.startswith(key + ".") for b in v.bad):
            continue  # already reported (type / unknown key)
        got, default = _raw(v.cfg, key), _raw(defaults, key)
        if got != default:
            yield Issue(key, got, f"has no effect: {reason}", f"remove the override (default: {default})")


RULES = (changed_inert_keys,)
