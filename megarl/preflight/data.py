"""Preflight of the datasets: build each split's dataloader as the trainer will, then
check every prompt's length (`data.truncation=error`), that every row has a ground truth
(`reward_model.ground_truth`; a None would reach the scorer, and the built-in ones compare
against the string "None"), and that every data source has a built-in scorer when no
custom reward function is set; with reward.reward_model.enable only the lengths (the reward model
replaces the scorers). Costs one tokenization pass."""

from __future__ import annotations

from typing import Any

from megarl.config.errors import Issue
from megarl.config.read import value_at
from megarl.config.schema.root import MegaRLConfig

MAX_LISTED_ROWS = 3


def data_issues(cfg: MegaRLConfig, tokenizer: Any, split: str, tokenizer_key: str = "data.tokenizer") -> list[Issue]:
    """Build `split`'s dataloader as the trainer will; check every prompt's length.
    tokenizer_key: the key the tokenizer came from (named in tokenizer problems, and in chat
    template problems unless actor_rollout_ref.model.custom_chat_template is set)."""
    from megarl.data import DataError, RLDataset, create_dataloader
    from megarl.data.dataset import CHAT_TEMPLATE_KEY

    files_key = f"data.{split}_files"
    try:
        loader = create_dataloader(cfg.data, tokenizer, split)
        dataset = loader.dataset
        if not isinstance(dataset, RLDataset):
            return []  # a custom dataset checks its own rows
        if cfg.reward.reward_model.enable:  # the reward model scores: no ground truth or scorer read
            return _overlong(cfg, dataset, files_key)
        issues = _overlong(cfg, dataset, files_key) + _ground_truths(cfg, dataset, files_key)
        return issues + (_data_sources(cfg, dataset, files_key) if not issues else [])
    except DataError as exc:
        key = {"data.tokenizer": tokenizer_key, CHAT_TEMPLATE_KEY: CHAT_TEMPLATE_KEY if value_at(cfg, CHAT_TEMPLATE_KEY) is not None
               else tokenizer_key}.get(exc.key, exc.key or files_key)
        value = value_at(cfg, key)
        where = exc.where
        if exc.file is not None and value == exc.file:  # the value shown already names the file
            where = ", ".join(p for p in (None if exc.row is None else f"row {exc.row}",
                                          None if exc.column is None else f"column {exc.column!r}") if p)
        problem = f"{where}: {exc.problem}" if where else exc.problem
        return [Issue(key, value, problem, exc.fix or f"fix the data in {files_key}")]


def _overlong(cfg: MegaRLConfig, dataset: Any, files_key: str) -> list[Issue]:
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


def _ground_truths(cfg: MegaRLConfig, dataset: Any, files_key: str) -> list[Issue]:
    """Rows whose reward_model (or its ground_truth) is None, first few by file and row."""
    missing = []
    for row, (path, index) in zip(dataset.rows, dataset.origins):
        reward_model = row.get("reward_model")
        if reward_model is None:
            missing.append(f"{path}, row {index}: reward_model is None")
        elif isinstance(reward_model, dict) and reward_model.get("ground_truth") is None:
            missing.append(f"{path}, row {index}: reward_model.ground_truth is None")
    if not missing:
        return []
    more = f" (+{len(missing) - MAX_LISTED_ROWS} more)" if len(missing) > MAX_LISTED_ROWS else ""
    return [Issue(
        files_key, value_at(cfg, files_key),
        f"{len(missing)} of {len(dataset)} rows have no ground truth for the reward function (it would get None; the "
        f"built-in scorers would compare with the string 'None'): {'; '.join(missing[:MAX_LISTED_ROWS])}{more}",
        "put the expected answer in reward_model.ground_truth (a string) of every row, or drop those rows",
    )]


def _data_sources(cfg: MegaRLConfig, dataset: Any, files_key: str) -> list[Issue]:
    """With the built-in scorers, every row's data source must have one."""
    if cfg.reward.custom_reward_function.path:
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
        "reward.custom_reward_function.path", None,
        f"{files_key} has data sources ({dataset.reward_fn_key} column) without a built-in scorer: {', '.join(unknown)}",
        f"set reward.custom_reward_function.path / name to your scoring function, or use a built-in data source "
        f"({', '.join(known_data_sources()[:4])}, ...: megarl.reward.known_data_sources())",
    )]
