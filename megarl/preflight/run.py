"""Preflight: load what the trainer will load — tokenizer, train/val datasets
(`megarl.preflight.data`), reward function, the agent loops' classes (`megarl.preflight.agent`) — and check the local machine can hold the requested
slots (`megarl.preflight.cluster`), in the driver before Ray starts, so a bad file fails as a
`ConfigError` naming the key, file and row (and the fix) instead of a traceback from a
worker or a placement timeout.
"""

from __future__ import annotations

from typing import Any

from megarl.config.errors import ConfigError, Issue
from megarl.config.read import to_dict, value_at
from megarl.config.schema.root import MegaRLConfig
from megarl.preflight.agent import agent_issues
from megarl.preflight.cluster import local_cluster_issues
from megarl.preflight.data import data_issues


def preflight(cfg: MegaRLConfig) -> Any:
    """Raise `ConfigError` listing every data / tokenizer / reward-function problem of the
    run's typed config; returns the tokenizer it loaded."""
    from megarl.data.tokenizer import tokenizer_key

    issues: list[Issue] = list(local_cluster_issues(cfg))
    tokenizer, issue = load_tokenizer(cfg)
    if issue is not None:
        issues.append(issue)
    else:
        for split in ("train", "val"):
            issues += data_issues(cfg, tokenizer, split, tokenizer_key(cfg))
    issues += reward_issues(cfg)
    issues += agent_issues(cfg)
    if issues:
        raise ConfigError(issues)
    return tokenizer


def load_tokenizer(cfg: MegaRLConfig) -> tuple[Any, Issue | None]:
    """The tokenizer the trainer uses (`megarl.data.tokenizer`); it must have a chat template
    (its own or model.custom_chat_template) unless a custom dataset class (data.custom_cls) does
    its own tokenizing (megarl's RLDataset renders chats)."""
    from megarl.data.tokenizer import load_data_tokenizer, tokenizer_dir, tokenizer_key

    key = tokenizer_key(cfg)
    path = tokenizer_dir(cfg)
    fix = (f"point {key} at a local HF dir with tokenizer files (tokenizer.json / tokenizer_config.json and a chat "
           "template, or set actor_rollout_ref.model.custom_chat_template)")
    try:
        tokenizer = load_data_tokenizer(cfg)
    except Exception as exc:  # transformers raises OSError / ValueError / KeyError ... for a bad dir
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        return None, Issue(key, value_at(cfg, key), f"cannot load a tokenizer from {path}: {type(exc).__name__}: {first}", fix)
    if not getattr(tokenizer, "chat_template", None) and not cfg.data.custom_cls.path:  # RLDataset renders chats
        return None, Issue(key, value_at(cfg, key), f"cannot load a tokenizer from {path}: it has no chat template", fix)
    return tokenizer, None


def reward_issues(cfg: MegaRLConfig) -> list[Issue]:
    """Load the custom reward function as the trainer will."""
    from megarl.reward import RewardFunctionError, load_reward_fn

    try:
        load_reward_fn(to_dict(cfg.reward.custom_reward_function))
    except RewardFunctionError as exc:
        text = str(exc)
        key = "reward.custom_reward_function.name" if text.startswith("reward.custom_reward_function.name") else "reward.custom_reward_function.path"
        problem = text.split(": ", 1)[1] if ": " in text else text
        fixes = {
            "reward.custom_reward_function.name": f"set reward.custom_reward_function.name to a function defined in {cfg.reward.custom_reward_function.path}",
            "reward.custom_reward_function.path": "point reward.custom_reward_function.path at an existing .py file that imports cleanly",
        }
        return [Issue(key, value_at(cfg, key), problem, fixes[key])]
    return []


__all__ = ["preflight", "load_tokenizer", "data_issues", "reward_issues"]
