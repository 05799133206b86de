"""Shared pieces of the policy losses: registry, config reading, ratio, metrics.

Every policy loss has the signature

    fn(old_log_prob, log_prob, advantages, response_mask,   # each [batch, response_len]
       loss_agg_mode, config, global_denominator=None,
       rollout_is_weights=None) -> (pg_loss scalar, metrics)

`config` is the typed actor section (`ActorConfig`, `actor_rollout_ref.actor`: clip_ratio*,
tau_*, policy_loss.*, loss_scale_factor), read by attribute (the yaml holds the defaults);
bypass_mode also takes `rollout_correction` (`algorithm.rollout_correction`) by keyword.
`rollout_is_weights` `[batch, response_len]` are detached rollout-correction weights that
multiply the per-token loss. metrics always has
"actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl" (python floats; 0.0 where
a loss has no such notion), plus loss-specific extras.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from megarl.algorithms.agg import Denominator, agg_loss
from megarl.algorithms.masked import masked_mean
from megarl.algorithms.registry import Registry

if TYPE_CHECKING:
    from megarl.config.schema.actor import ActorConfig

LOG_RATIO_CLAMP = 20.0

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]
POLICY_LOSS_REGISTRY: Registry[PolicyLossFn] = Registry(
    "policy loss", "actor_rollout_ref.actor.policy_loss.loss_mode"
)
POLICY_LOSSES = POLICY_LOSS_REGISTRY.names()
register_policy_loss = POLICY_LOSS_REGISTRY.register
get_policy_loss = POLICY_LOSS_REGISTRY.get


def clip_range(config: ActorConfig) -> tuple[float, float]:
    """(clip_ratio_low, clip_ratio_high); a null one means `clip_ratio` (the yaml's documented meaning)."""
    clip_ratio = config.clip_ratio
    low = clip_ratio if config.clip_ratio_low is None else config.clip_ratio_low
    high = clip_ratio if config.clip_ratio_high is None else config.clip_ratio_high
    return float(low), float(high)


def log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor, clamp: bool = True) -> torch.Tensor:
    """log(pi / pi_old) `[batch, response_len]`, clamped to +-20 for a finite exp."""
    lr = log_prob - old_log_prob
    return lr.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP) if clamp else lr


def aggregate(
    pg_losses: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    loss_scale_factor: float | None,
    global_denominator: Denominator,
    rollout_is_weights: torch.Tensor | None,
) -> torch.Tensor:
    """Apply rollout IS weights, then `agg_loss` (`loss_scale_factor`: `actor.loss_scale_factor`)."""
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights.detach()
    return agg_loss(pg_losses, response_mask, loss_agg_mode, global_denominator, loss_scale_factor)


def pg_metrics(
    response_mask: torch.Tensor,
    neg_log_ratio: torch.Tensor,
    clipfrac: torch.Tensor | None = None,
    clipfrac_lower: torch.Tensor | None = None,
    **extra: float,
) -> dict[str, float]:
    """Standard metric dict; `neg_log_ratio` = old_log_prob - log_prob (ppo_kl is its mean)."""
    def mean(x: torch.Tensor | None) -> float:
        return 0.0 if x is None else masked_mean(x.detach().float(), response_mask).item()

    out = {
        "actor/pg_clipfrac": mean(clipfrac),
        "actor/pg_clipfrac_lower": mean(clipfrac_lower),
        "actor/ppo_kl": mean(neg_log_ratio),
    }
    out.update(extra)
    return out
