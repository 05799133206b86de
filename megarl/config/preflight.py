"""Preflight: load what the trainer will load — tokenizer, train/val datasets, reward
function — in the driver before Ray starts, so a bad file fails as a `ConfigError`
naming the key, file and row (and the fix) instead of a traceback from a worker.

Costs one pass over the datasets: with `data.truncation=error` every prompt is tokenized
once here so an overlong prompt is found before the first step, not at the step that
samples it.
"""

from __future__ import annotations

import os
from typing import Any

from omegaconf import DictConfig, OmegaConf

from megarl.config.errors import ConfigError, Issue

_TOKENIZER_KEYS = ("data.tokenizer", "actor_rollout_ref.model.tokenizer_path", "actor_rollout_ref.model.path")
MAX_LISTED_ROWS = 3


def preflight(cfg: DictConfig) -> Any:
    """Raise `ConfigError` listing every data / tokenizer / reward-function problem of the
    resolved, validated `cfg`; returns the tokenizer it loaded."""
    issues: list[Issue] = list(local_cluster_issues(cfg))
    tokenizer, issue = load_tokenizer(cfg)
    if issue is not None:
        issues.append(issue)
    else:
        for split in ("train", "val"):
            issues += data_issues(cfg, tokenizer, split, tokenizer_key(cfg))
    issues += reward_issues(cfg)
    if issues:
        raise ConfigError(issues)
    return tokenizer


CPU_PER_CPU_RANK = 0.5  # what megarl.trainer reserves per rank when trainer.device=cpu


def local_cluster_issues(cfg: DictConfig) -> list[Issue]:
    """Without RAY_ADDRESS, run_ppo starts a one-node Ray on this machine: the requested
    slots must fit it, or placement would wait (minutes) and fail. A cluster named by
    RAY_ADDRESS is not checked here (its nodes are not visible before Ray starts)."""
    if os.environ.get("RAY_ADDRESS"):
        return []
    nnodes, per_node = _value(cfg, "trainer.nnodes"), _value(cfg, "trainer.n_gpus_per_node")
    if nnodes > 1:
        return [Issue("trainer.nnodes", nnodes, "a local Ray (RAY_ADDRESS is not set) has one node",
                      "start a Ray cluster (launch/ray_*.sh) and export RAY_ADDRESS, or set trainer.nnodes=1")]
    import torch

    device = _value(cfg, "trainer.device")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device == "cuda" or (device == "auto" and gpus > 0):
        if per_node > gpus:
            return [Issue("trainer.n_gpus_per_node", per_node, f"this machine has {gpus} CUDA GPU(s) (trainer.device={device})",
                          f"set trainer.n_gpus_per_node <= {gpus}" + ("" if gpus else ", or trainer.device=cpu"))]
        return []
    cpus = _value(cfg, "ray_init.num_cpus") or os.cpu_count() or 1
    need = per_node * CPU_PER_CPU_RANK
    if need > cpus:
        source = "ray_init.num_cpus" if _value(cfg, "ray_init.num_cpus") else "this machine"
        return [Issue("trainer.n_gpus_per_node", per_node,
                      f"{per_node} CPU ranks reserve {need:g} CPUs ({CPU_PER_CPU_RANK} each) but {source} has {cpus}",
                      f"set trainer.n_gpus_per_node <= {int(cpus / CPU_PER_CPU_RANK)} or raise ray_init.num_cpus")]
    return []


def _value(cfg: DictConfig, key: str) -> Any:
    value = OmegaConf.select(cfg, key, default=None)
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def tokenizer_key(cfg: DictConfig) -> str:
    """The key naming the tokenizer dir the trainer uses (data.tokenizer, else
    model.tokenizer_path, else model.path)."""
    return next(k for k in _TOKENIZER_KEYS if _value(cfg, k) or k == _TOKENIZER_KEYS[-1])


def load_tokenizer(cfg: DictConfig) -> tuple[Any, Issue | None]:
    """The tokenizer the trainer uses; it must have a chat template (prompts are chats)."""
    key = tokenizer_key(cfg)
    path = os.path.expanduser(str(_value(cfg, key)))
    fix = f"point {key} at a local HF dir with tokenizer files (tokenizer.json / tokenizer_config.json and a chat template)"
    try:
        from transformers import AutoTokenizer

        trust = bool(_value(cfg, "actor_rollout_ref.model.trust_remote_code"))
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust)
    except Exception as exc:  # transformers raises OSError / ValueError / KeyError ... for a bad dir
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        return None, Issue(key, _value(cfg, key), f"cannot load a tokenizer from {path}: {type(exc).__name__}: {first}", fix)
    if not getattr(tokenizer, "chat_template", None):
        return None, Issue(key, _value(cfg, key), f"cannot load a tokenizer from {path}: it has no chat template", fix)
    return tokenizer, None


def data_issues(cfg: DictConfig, tokenizer: Any, split: str, tokenizer_key: str = "data.tokenizer") -> list[Issue]:
    """Build `split`'s dataloader as the trainer will; check every prompt's length.
    tokenizer_key: the key the tokenizer came from (named in tokenizer problems)."""
    from megarl.data import DataError, RLDataset, create_dataloader

    files_key = f"data.{split}_files"
    try:
        loader = create_dataloader(cfg.data, tokenizer, split)
        dataset = loader.dataset
        if not isinstance(dataset, RLDataset):
            return []  # a custom dataset checks its own rows
        issues = _overlong(cfg, dataset, files_key)
        return issues + (_data_sources(cfg, dataset, files_key) if not issues else [])
    except DataError as exc:
        key = tokenizer_key if exc.key == "data.tokenizer" else exc.key or files_key
        value = _value(cfg, key)
        where = exc.where
        if exc.file is not None and value == exc.file:  # the value shown already names the file
            where = ", ".join(p for p in (None if exc.row is None else f"row {exc.row}",
                                          None if exc.column is None else f"column {exc.column!r}") if p)
        problem = f"{where}: {exc.problem}" if where else exc.problem
        return [Issue(key, value, problem, exc.fix or f"fix the data in {files_key}")]


def _overlong(cfg: DictConfig, dataset: Any, files_key: str) -> list[Issue]:
    if dataset.truncation != "error":
        return []
    rows = dataset.overlong_rows()  # the filter already dropped them when filter_overlong_prompts
    if not rows:
        return []
    from megarl.data.dataset import TOO_LONG_FIX

    limit = dataset.max_prompt_length
    listed = "; ".join(f"{f}, row {r}: {n} tokens" for f, r, n in rows[:MAX_LISTED_ROWS])
    more = f" (+{len(rows) - MAX_LISTED_ROWS} more)" if len(rows) > MAX_LISTED_ROWS else ""
    return [Issue(
        "data.max_prompt_length", limit,
        f"{len(rows)} of {len(dataset)} prompts in {files_key} are longer and data.truncation=error: {listed}{more}",
        f"{TOO_LONG_FIX}; the longest prompt has {max(n for _, _, n in rows)} tokens",
    )]


def _data_sources(cfg: DictConfig, dataset: Any, files_key: str) -> list[Issue]:
    """With the built-in scorers, every row's data source must have one."""
    if _value(cfg, "custom_reward_function.path"):
        return []
    from megarl.reward import default_compute_score, known_data_sources

    first_row: dict[str, tuple[str, int]] = {}
    for row, origin in zip(dataset.rows, dataset.origins):
        first_row.setdefault(row[dataset.reward_fn_key], origin)
    unknown = []
    for source, (path, row) in first_row.items():
        try:
            default_compute_score(source, "", "0")
        except ValueError:
            unknown.append(f"{source!r} (first at {path}, row {row})")
    if not unknown:
        return []
    return [Issue(
        "custom_reward_function.path", None,
        f"{files_key} has data sources ({dataset.reward_fn_key} column) without a built-in scorer: {', '.join(unknown)}",
        f"set custom_reward_function.path / name to your scoring function, or use a built-in data source "
        f"({', '.join(known_data_sources()[:4])}, ...: megarl.reward.known_data_sources())",
    )]


def reward_issues(cfg: DictConfig) -> list[Issue]:
    """Load the custom reward function as the trainer will."""
    from megarl.reward import RewardFunctionError, load_reward_fn

    try:
        load_reward_fn(cfg.get("custom_reward_function"))
    except RewardFunctionError as exc:
        text = str(exc)
        key = "custom_reward_function.name" if text.startswith("custom_reward_function.name") else "custom_reward_function.path"
        problem = text.split(": ", 1)[1] if ": " in text else text
        fixes = {
            "custom_reward_function.name": f"set custom_reward_function.name to a function defined in {_value(cfg, 'custom_reward_function.path')}",
            "custom_reward_function.path": "point custom_reward_function.path at an existing .py file that imports cleanly",
        }
        return [Issue(key, _value(cfg, key), problem, fixes[key])]
    return []


__all__ = ["preflight", "load_tokenizer", "data_issues", "reward_issues"]
