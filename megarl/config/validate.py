"""`validate_config`: the schema check plus every cross-key rule, all issues at once."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from omegaconf import DictConfig

from megarl.config import (
    rules_agent, rules_algo, rules_batch, rules_compat, rules_engines, rules_model, rules_optim, rules_parallel,
    rules_reward_model, rules_trainer,
)
from megarl.config.errors import ConfigError, Issue
from megarl.config.schema import MegaRLConfig
from megarl.config.view import Skip, View, has_module
from megarl.config.walk import check_tree

Rule = Callable[[View], Iterable[Issue]]
RULES: tuple[Rule, ...] = (
    *rules_batch.RULES,
    *rules_parallel.RULES,
    *rules_algo.RULES,
    *rules_optim.RULES,
    *rules_trainer.RULES,
    *rules_compat.RULES,
    *rules_engines.RULES,
    *rules_agent.RULES,
    *rules_reward_model.RULES,
    rules_model.run,
)


def _run(rule: Callable[..., Iterable[Issue]], *args) -> Iterator[Issue]:
    try:
        yield from rule(*args)
    except Skip:  # needs a key that is already reported
        return


def check_schema(cfg: DictConfig) -> list[Issue]:
    """Only the per-key checks (unknown/missing keys, types, ranges, names); no files read."""
    return check_tree(cfg, MegaRLConfig)[0]


def collect_issues(cfg: DictConfig, *, installed: Callable[[str], bool] = has_module, files: bool = True) -> list[Issue]:
    """Every problem of `cfg` (empty list = valid); `installed` / `files`: see `View` (a plan
    judges another machine's packages and needs no data files, weights or tokenizers)."""
    issues, bad = check_tree(cfg, MegaRLConfig)
    v = View(cfg, bad, installed=installed, files=files)
    for rule in RULES:
        issues += _run(rule, v)
    try:
        pairs = list(rules_parallel.run_role_rules(v))
    except Skip:
        pairs = []
    for rule, role in pairs:
        issues += _run(rule, v, role)
    return _dedupe(issues)


def _dedupe(issues: list[Issue]) -> list[Issue]:
    seen: set[tuple[str, str]] = set()
    out = []
    for issue in issues:
        if (issue.key, issue.problem) not in seen:
            seen.add((issue.key, issue.problem))
            out.append(issue)
    return out


def validate_config(cfg: DictConfig, *, installed: Callable[[str], bool] = has_module, files: bool = True) -> None:
    """Raise `ConfigError` listing every problem of `cfg` (full dotted key, value, fix)."""
    issues = collect_issues(cfg, installed=installed, files=files)
    if issues:
        raise ConfigError(issues)
