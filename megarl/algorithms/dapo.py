"""DAPO pieces (arXiv:2503.14476): dynamic-sampling group filter and overlong reward shaping."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from megarl.algorithms.registry import check_choice

# Metrics computed from the batch itself; any other name is looked up in reward_extra_info
# (e.g. "acc", "score" from the reward function).
BUILTIN_FILTER_METRICS: tuple[str, ...] = ("seq_reward", "seq_final_reward")


def filter_metric_values(
    metric: str,
    token_level_scores: torch.Tensor | None = None,
    token_level_rewards: torch.Tensor | None = None,
    reward_extra_info: Mapping[str, Sequence[Any]] | None = None,
) -> np.ndarray:
    """Per-response values `[batch]` of `algorithm.filter_groups.metric`.

    seq_reward = sum of token_level_scores; seq_final_reward = sum of token_level_rewards
    (after any KL penalty); other names come from reward_extra_info (e.g. "acc").
    """
    if metric == "seq_reward" and token_level_scores is not None:
        return token_level_scores.sum(-1).detach().cpu().numpy()
    if metric == "seq_final_reward" and token_level_rewards is not None:
        return token_level_rewards.sum(-1).detach().cpu().numpy()
    extra = reward_extra_info or {}
    if metric in extra:
        return np.asarray(extra[metric])
    valid = tuple(BUILTIN_FILTER_METRICS) + tuple(extra)
    check_choice(metric, valid, "filter metric", "algorithm.filter_groups.metric")
    raise ValueError(f"algorithm.filter_groups.metric={metric} needs the tensor it is computed from")


def filter_groups(
    uids: Sequence[Any] | np.ndarray, metric_values: Sequence[Any] | np.ndarray
) -> tuple[np.ndarray, dict[str, int]]:
    """Dynamic sampling: keep the responses of prompts whose metric values are not all
    equal (they give a non-zero group-relative advantage). Single-response groups are kept.

    Args: uids, metric_values: length batch.
    Returns: (kept sample indices, ascending int64 array; counts {"num_groups",
        "num_kept_groups", "num_samples", "num_kept_samples"}).
    """
    uids = np.asarray(uids, dtype=object)
    values = np.asarray(metric_values)
    if len(uids) != len(values):
        raise ValueError(f"filter_groups: {len(uids)} uids but {len(values)} metric values")
    members: dict[Any, list[int]] = {}
    for i, u in enumerate(uids.tolist()):
        members.setdefault(u, []).append(i)
    kept_groups = [
        idx for idx in members.values() if len(idx) == 1 or not np.all(values[idx] == values[idx[0]])
    ]
    kept = np.sort(np.array([i for idx in kept_groups for i in idx], dtype=np.int64))
    return kept, {
        "num_groups": len(members),
        "num_kept_groups": len(kept_groups),
        "num_samples": len(uids),
        "num_kept_samples": int(kept.size),
    }


def overlong_penalty(
    response_lengths: torch.Tensor, max_response_length: int, overlong_buffer_len: int, penalty_factor: float
) -> torch.Tensor:
    """Soft overlong punishment `[batch]` (<= 0): 0 up to max_response_length - buffer_len,
    then falls linearly to -penalty_factor at max_response_length.

    Config: reward.reward_kwargs.overlong_buffer_cfg.{len, penalty_factor}; max_response_length =
    data.max_response_length.
    """
    if overlong_buffer_len <= 0:
        raise ValueError(f"reward.reward_kwargs.overlong_buffer_cfg.len must be > 0, got {overlong_buffer_len}")
    if overlong_buffer_len > max_response_length:
        raise ValueError(
            f"reward.reward_kwargs.overlong_buffer_cfg.len ({overlong_buffer_len}) exceeds "
            f"data.max_response_length ({max_response_length})"
        )
    expected = max_response_length - overlong_buffer_len
    exceed = response_lengths.float() - expected
    return torch.clamp(-exceed / overlong_buffer_len * penalty_factor, max=0.0)


def apply_overlong_penalty(
    token_level_scores: torch.Tensor,
    response_mask: torch.Tensor,
    max_response_length: int,
    overlong_buffer_len: int,
    penalty_factor: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Add `overlong_penalty` to each response's last valid token.

    Args: token_level_scores, response_mask: `[batch, response_len]` (right-padded).
    Returns: (new scores `[batch, response_len]`, penalties `[batch]`).
    """
    lengths = response_mask.sum(-1).long()
    penalty = overlong_penalty(lengths, max_response_length, overlong_buffer_len, penalty_factor)
    out = token_level_scores.clone()
    rows = torch.nonzero(lengths > 0, as_tuple=True)[0]
    out[rows, lengths[rows] - 1] += penalty[rows].to(out.dtype)
    return out, penalty
