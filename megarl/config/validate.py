"""Validation entry points: the per-key schema check plus every cross-key rule, all issues at once.

Rules that need megarl's runtime (which architectures megarl.models builds) are not here: the caller
passes them (`megarl.preflight.RUNTIME_RULES`), and they run with the same view of the config, so a
bad model and a bad key are reported in one error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from omegaconf import DictConfig

from megarl.config.check_keys import check_tree
from megarl.config.errors import ConfigError, Issue
from megarl.config.rules import (
    agent,
    algorithm,
    batch,
    distillation,
    engines,
    megatron_fsdp,
    model,
    optim,
    parallel,
    reward_model,
    rollout_parallel,
    router_replay,
    trainer,
    trainer_v1,
)
from megarl.config.rules.view import Skip, View, has_module
from megarl.config.schema.root import MegaRLConfig
from megarl.config.verl_compat import check as verl_compat

Rule = Callable[[View], Iterable[Issue]]
RULES: tuple[Rule, ...] = (
    *batch.RULES,
    *parallel.RULES,
    *algorithm.RULES,
    *optim.RULES,
    *trainer.RULES,
    *trainer_v1.RULES,
    *verl_compat.RULES,
    *engines.RULES,
    *agent.RULES,
    *reward_model.RULES,
    *rollout_parallel.RULES,
    *router_replay.RULES,
    *distillation.RULES,
    *megatron_fsdp.RULES,
    model.run,
)


def _run(rule: Callable[..., Iterable[Issue]], *args) -> Iterator[Issue]:
    try:
        yield from rule(*args)
    except Skip:  # needs a key that is already reported
        return


def check_schema(cfg: DictConfig) -> list[Issue]:
    """Only the per-key checks (unknown/missing keys, types, ranges, names); no files read."""
    return check_tree(cfg, MegaRLConfig)[0]


def collect_issues(cfg: DictConfig, runtime_rules: Sequence[Rule] = (), *, installed: Callable[[str], bool] = has_module,
                   files: bool = True) -> list[Issue]:
    """Every problem of `cfg` (empty list = valid); `runtime_rules` run after the config's own;
    `installed` / `files`: see `View` (a plan judges another machine's packages and needs no data
    files, weights or tokenizers)."""
    issues, bad = check_tree(cfg, MegaRLConfig)
    v = View(cfg, bad, installed=installed, files=files)
    for rule in (*RULES, *runtime_rules):
        issues += _run(rule, v)
    try:
        pairs = list(parallel.run_role_rules(v))
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


def validate_config(cfg: DictConfig, runtime_rules: Sequence[Rule] = (), *, installed: Callable[[str], bool] = has_module,
                    files: bool = True) -> None:
    """Raise `ConfigError` listing every problem of `cfg` (full dotted key, value, fix)."""
    issues = collect_issues(cfg, runtime_rules, installed=installed, files=files)
    if issues:
        raise ConfigError(issues)
