"""Entry point: `python -m megarl.main_eval data.path=<generations.parquet>` (verl's evaluation.yaml).

Scores every response of every row (`data.response_key`, a list per row, as main_generation
writes) with `custom_reward_function` (default: megarl's built-in scorer for the row's
`data.data_source_key`) against `data.reward_model_key`.ground_truth, and prints per data source:

* `test_score/<source>`: verl's number, the mean over rows of each row's mean score;
* `pass@k/<source>` for k = 1, 2, 4, ... <= n (responses per row): the unbiased estimate
  1 - C(n - c, k) / C(n, k) averaged over rows, c = responses with the full score (>= 1).

Each call runs in a child process bounded by `SCORE_TIMEOUT_S` (megarl.reward.scoring_pool; a
timeout scores 0 and is counted); a scorer error names the row. Exit code 2 on bad input.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections import defaultdict
from importlib.resources import files
from typing import Any

import hydra
from omegaconf import DictConfig

from megarl.config.errors import ConfigError, Issue

CONFIG_DIR = str(files("megarl") / "configs")
SCORE_TIMEOUT_S = 300.0  # verl's reward.timeout default; evaluation.yaml has no key for it
FULL_SCORE = 1.0


def pass_at_k(n: int, correct: int, k: int) -> float:
    """Unbiased pass@k of one prompt with `correct` of `n` samples right (Chen et al. 2021)."""
    if n - correct < k:
        return 1.0
    return 1.0 - math.comb(n - correct, k) / math.comb(n, k)


def summarize(rows: list[tuple[str, list[float]]]) -> dict[str, float]:
    """Per data source: verl's `test_score/<source>` and `pass@k/<source>`. `rows`: (source, scores of its responses)."""
    by_source: dict[str, list[list[float]]] = defaultdict(list)
    for source, scores in rows:
        by_source[source].append(scores)
    metrics: dict[str, float] = {}
    for source, groups in sorted(by_source.items()):
        metrics[f"test_score/{source}"] = sum(sum(g) / len(g) for g in groups) / len(groups)
        n = min(len(g) for g in groups)
        k = 1
        while k <= n:
            metrics[f"pass@{k}/{source}"] = sum(pass_at_k(len(g), sum(s >= FULL_SCORE for s in g), k)
                                                for g in groups) / len(groups)
            k *= 2
    return metrics


def _read(cfg: DictConfig) -> list[tuple[str, list[str], Any]]:
    """(data source, responses, ground truth) per row, or ConfigError naming the key / row."""
    import pyarrow.parquet as pq

    d = cfg.data
    path = os.path.expanduser(d.path)
    if not os.path.isfile(path):
        raise ConfigError([Issue("data.path", d.path, "file does not exist", "give main_generation's output parquet")])
    table = pq.read_table(path)
    missing = [(key, getattr(d, key)) for key in ("response_key", "data_source_key", "reward_model_key")
               if getattr(d, key) not in table.column_names]
    if missing:
        raise ConfigError([Issue(f"data.{key}", name, f"no such column in {d.path} (columns: {table.column_names})",
                                 f"set data.{key} to one of them") for key, name in missing])
    rows = []
    for i, (source, responses, reward) in enumerate(zip(*(table.column(getattr(d, k)).to_pylist()
                                                        for k in ("data_source_key", "response_key", "reward_model_key")))):
        if isinstance(responses, str):
            responses = [responses]
        if not responses:
            raise ConfigError([Issue("data.response_key", d.response_key, f"row {i} has no responses", "drop the row")])
        if not isinstance(reward, dict) or reward.get("ground_truth") is None:
            raise ConfigError([Issue("data.reward_model_key", d.reward_model_key, f"row {i} has no ground_truth",
                                     "fill <reward_model>.ground_truth in the data")])
        rows.append((source, list(responses), reward["ground_truth"]))
    return rows


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """Score `data.path` (see the module docstring); returns the metrics."""
    from megarl.reward.custom import load_reward_fn
    from megarl.reward.scoring_pool import ScoringPool

    rows = _read(cfg)
    fn = load_reward_fn(cfg.custom_reward_function)
    calls = [(source, response, truth) for source, responses, truth in rows for response in responses]
    pool = ScoringPool(fn, cfg.ray_kwargs.ray_init.num_cpus or os.cpu_count() or 1, SCORE_TIMEOUT_S)
    try:
        outcomes = pool.run(calls)
    finally:
        pool.close()
    scores, timeouts, i = [], 0, 0
    for row, (source, responses, _) in enumerate(rows):
        row_scores = []
        for _ in responses:
            outcome = outcomes[i]
            i += 1
            if outcome.kind == "error":
                raise RuntimeError(f"{cfg.data.path}: row {row} (data_source={source!r}): the reward function raised "
                                   f"{outcome.error_type}: {outcome.error_text}\n{outcome.traceback}")
            timeouts += outcome.kind == "timeout"
            value = outcome.value["score"] if isinstance(outcome.value, dict) else outcome.value
            row_scores.append(0.0 if outcome.kind == "timeout" else float(value))
        scores.append((source, row_scores))
    metrics = summarize(scores)
    if timeouts:
        metrics["reward/timeouts"] = float(timeouts)
    return metrics


@hydra.main(config_path=CONFIG_DIR, config_name="evaluation", version_base="1.3")
def main(cfg: DictConfig) -> None:
    if cfg.ray_kwargs.timeline_json_file is not None:
        print("megarl: ray_kwargs.timeline_json_file has no effect: megarl.main_eval starts no Ray cluster", flush=True)
    try:
        metrics = evaluate(cfg)
    except ConfigError as error:
        print(f"megarl: {error}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(metrics), flush=True)


if __name__ == "__main__":
    main()
