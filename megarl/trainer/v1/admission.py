"""Admission control: how many prompts may enter generation now (pure).

verl's V1 feed, counted as AReaL's staleness manager counts it: by the time the engines hold
version ``v`` at most ``floor((warmup + v + 1) * B)`` prompts have been admitted, plus one per
group evicted since the start (its replacement). ``warmup`` = ``num_warmup_batches``, ``B`` =
``data.train_batch_size``. A group admitted while the engines hold ``v`` generates its first token
with version ``>= v``; trained in admission order, whole batches at a time, it is trained at a step
whose version is at most ``v + ceil(warmup)``, so the pacing alone bounds its staleness by
``ceil(warmup)``, which the config rules keep ``<= max_off_policy_threshold - 1``.
"""

from __future__ import annotations

import math


def staleness_bound(max_off_policy_threshold: int | None) -> int | None:
    """verl's threshold counts the versions a sample spans, the step it is trained in included:
    the most versions its oldest token may lag is one less (None: no bound)."""
    return None if max_off_policy_threshold is None else int(max_off_policy_threshold) - 1


def admission_capacity(version: int, batch_size: int, warmup_batches: float, admitted: int, evicted: int) -> int:
    """Prompts that may be admitted while the engines hold ``version``, ``admitted`` having been
    admitted and ``evicted`` evicted so far (counts since the run started, or since the resumed step)."""
    limit = math.floor((warmup_batches + version + 1) * batch_size + 1e-9) + evicted
    return max(0, limit - admitted)
