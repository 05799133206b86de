"""Metrics from the extra keys of the dicts a reward function returns (``{"score": s, "acc": a, ...}``).

Each key whose values are numbers (bools count as 0 / 1) becomes ``reward/<key>/mean``, averaged
over the rows that returned it (a key only some rows return is not averaged with their absence).
A key with a value that is not a number (a string, a list) cannot be averaged: it stays in the
batch (and the rollout dumps) and is named once per run instead of being dropped without a word.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# reward_extra_info keys the managers always add; logged elsewhere (critic/score, reward/timeouts)
MANAGER_KEYS = ("score", "timeout")


def _numeric(value: Any) -> bool:
    return isinstance(value, (numbers.Real, np.bool_))


def extra_metrics(extra: Mapping[str, Sequence[Any]], named: set[str]) -> dict[str, float]:
    """``reward/<key>/mean`` of each numeric extra key over the rows that have it (``None``: the row's
    dict had no such key). A key holding anything else is printed once: ``named`` keeps the keys
    already printed this run (updated in place)."""
    metrics: dict[str, float] = {}
    for key, values in extra.items():
        if key in MANAGER_KEYS:
            continue
        present = [v for v in values if v is not None]
        odd = next((v for v in present if not _numeric(v)), None)
        if odd is not None:
            if key not in named:
                named.add(key)
                print(f"[megarl] reward function: the extra key {key!r} of its dicts holds {type(odd).__name__} values "
                      f"(e.g. {odd!r:.80}), not numbers: kept with the batch (trainer.rollout_data_dir dumps it), not "
                      f"logged as a metric", flush=True)
            continue
        if present:
            metrics[f"reward/{key}/mean"] = float(np.mean(np.asarray(present, dtype=np.float64)))
    return metrics
