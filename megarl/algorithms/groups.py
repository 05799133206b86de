"""Grouping of samples by prompt `uid` (the n responses of one prompt form a group)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


def group_ids(index: Sequence[Any] | np.ndarray, device: torch.device | str = "cpu") -> tuple[torch.Tensor, int]:
    """Map uids (any hashable objects, length batch) to dense ids `[batch]` in order of first appearance."""
    if index is None:
        raise ValueError("a group-based advantage estimator needs the prompt uids (non_tensor_batch['uid'])")
    seen: dict[Any, int] = {}
    ids = [seen.setdefault(u, len(seen)) for u in np.asarray(index, dtype=object).tolist()]
    return torch.tensor(ids, dtype=torch.long, device=device), len(seen)


def group_mean_std(
    scores: torch.Tensor, gid: torch.Tensor, num_groups: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample group mean, unbiased group std and group size, each `[batch]`.

    Singleton groups get mean 0 and std 1 (verl's convention: the advantage of a lone
    response is its own score).
    """
    s = scores.to(torch.float64)
    count = torch.zeros(num_groups, dtype=torch.float64, device=s.device).index_add_(0, gid, torch.ones_like(s))
    total = torch.zeros_like(count).index_add_(0, gid, s)
    mean = total / count
    sq = torch.zeros_like(count).index_add_(0, gid, (s - mean[gid]) ** 2)
    std = torch.sqrt(sq / (count - 1).clamp_min(1.0))
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    dt = scores.dtype if scores.is_floating_point() else torch.float32
    return mean[gid].to(dt), std[gid].to(dt), count[gid].to(dt)
