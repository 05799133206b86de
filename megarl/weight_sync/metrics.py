"""Rollout vs training log-prob gap (the same tokens, two kernels)."""

from __future__ import annotations

import torch


def log_prob_gap(
    rollout_log_probs: torch.Tensor, actor_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """Mean and max ``|rollout - actor|`` over valid response tokens.

    Args:
        rollout_log_probs: ``[B, R]`` vLLM's sampled-token log-probs.
        actor_log_probs: ``[B, R]`` the actor's log-probs of the same tokens at the
            same temperature (``old_log_probs``).
        response_mask: ``[B, R]`` 1 for response tokens.

    Returns:
        ``{"rollout/log_prob_gap_mean", "rollout/log_prob_gap_max"}`` (nats); zeros
        when no token is valid.
    """
    if rollout_log_probs.shape != actor_log_probs.shape or actor_log_probs.shape != response_mask.shape:
        raise ValueError(
            f"log_prob_gap: shapes differ: rollout {tuple(rollout_log_probs.shape)}, actor "
            f"{tuple(actor_log_probs.shape)}, response_mask {tuple(response_mask.shape)}"
        )
    mask = response_mask.bool()
    if not mask.any():
        return {"rollout/log_prob_gap_mean": 0.0, "rollout/log_prob_gap_max": 0.0}
    gap = (rollout_log_probs.double() - actor_log_probs.double()).abs()[mask]
    return {"rollout/log_prob_gap_mean": float(gap.mean()), "rollout/log_prob_gap_max": float(gap.max())}
