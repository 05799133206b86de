"""NaN/Inf in a training update: stop with the step and phase named, or skip the step.

``trainer.nan_policy`` (megarl addition, default ``stop``) reaches the actor and critic
workers in ``data.meta_info["nan_policy"]`` with ``meta_info["global_step"]``. The
optimizer never applies a non-finite gradient (``megarl.workers.megatron.optim``
guards it, like megatron's fp16 overflow skip); after each mini-batch step the worker calls
``check_update``: with ``stop`` a non-finite loss or grad norm raises ``NonFiniteError``
(the weights are those of the last good step), with ``skip`` the mini-batch's update is
dropped and counted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from megarl.config.names import NAN_POLICIES  # stop | skip


class NonFiniteError(FloatingPointError):
    """A loss or gradient norm was NaN/Inf; the message names the global step and phase."""


def nonfinite_values(metrics: Mapping[str, float]) -> dict[str, float]:
    """The entries of ``metrics`` that are NaN or +-Inf (numbers only)."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not math.isfinite(float(v))}


def check_update(
    metrics: Mapping[str, float],
    *,
    role: str,
    phase: str,
    global_step: int | None,
    policy: str,
    mini_batch: int,
    num_mini_batches: int,
) -> bool:
    """Whether this mini-batch's step is to be dropped (non-finite under ``skip``).

    Args:
        metrics: the step's metrics (losses, ``<role>/grad_norm``); NaN grad norm = the
            optimizer skipped the step.
        role: config prefix for messages ("actor_rollout_ref.actor", "critic").
        phase: the trainer phase ("update_actor", "update_critic").
        global_step: trainer step (``meta_info["global_step"]``), None when called directly.
        policy: ``trainer.nan_policy`` (stop | skip).
        mini_batch, num_mini_batches: position of the step in this update (0-based).

    Raises:
        NonFiniteError: under ``stop`` when a value is non-finite.
        ValueError: an unknown policy.
    """
    if policy not in NAN_POLICIES:
        raise ValueError(f"trainer.nan_policy={policy!r}: choose one of {NAN_POLICIES}")
    bad = nonfinite_values(metrics)
    if not bad:
        return False
    if policy == "skip":
        return True
    values = ", ".join(f"{k}={v}" for k, v in sorted(bad.items()))
    step = "?" if global_step is None else global_step
    raise NonFiniteError(
        f"{role}: non-finite loss/gradient at global step {step}, phase {phase} (mini-batch {mini_batch + 1} "
        f"of {num_mini_batches}): {values}. The optimizer step was not applied; the weights are those of the "
        "last finite step. Look for NaN/Inf in the rewards, advantages or returns, or a too high lr; or set "
        "trainer.nan_policy=skip to drop such steps and continue."
    )
