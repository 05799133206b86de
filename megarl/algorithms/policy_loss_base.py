"""Shared pieces of the policy losses: registry, config reading, ratio, metrics.

Every policy loss has the signature

    fn(old_log_prob, log_prob, advantages, response_mask,   # each [batch, response_len]
       loss_agg_mode="token-mean", config=None, global_denominator=None,
       rollout_is_weights=None) -> (pg_loss scalar, metrics)

`config` is the actor config (`actor_rollout_ref.actor`: clip_ratio*, tau_*,
policy_loss.*, loss_scale_factor); `rollout_is_weights` `[batch, response_len]` are
detached rollout-correction weights that multiply the per-token loss. metrics always has
"actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl" (python floats; 0.0 where
a loss has no such notion), plus loss-specific extras.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from megarl.algorithms.agg import Denominator, agg_loss
from megarl.algorithms.masked import masked_mean
from megarl.algorithms.registry import Registry, cfg_get

ACTOR_PREFIX = "actor_rollout_ref.actor."
LOG_RATIO_CLAMP = 20.0

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]
POLICY_LOSS_REGISTRY: Registry[PolicyLossFn] = Registry("policy loss", ACTOR_PREFIX + "policy_loss.loss_mode")
POLICY_LOSSES = POLICY_LOSS_REGISTRY.names()
register_policy_loss = POLICY_LOSS_REGISTRY.register
get_policy_loss = POLICY_LOSS_REGISTRY.get


def actor_cfg(config: Any, key: str, default: Any = ...) -> Any:
    """Read an actor config key; a missing required key names its full path."""
    if default is ...:
        return cfg_get(config, key, prefix=ACTOR_PREFIX)
    return cfg_get(config, key, default, prefix=ACTOR_PREFIX)


def clip_range(config: Any) -> tuple[float, float]:
    """(clip_ratio_low, clip_ratio_high); each defaults to `clip_ratio` when unset."""
    clip_ratio = actor_cfg(config, "clip_ratio", 0.2)
    low = actor_cfg(config, "clip_ratio_low", clip_ratio)
    high = actor_cfg(config, "clip_ratio_high", clip_ratio)
    return float(low), float(high)


def log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor, clamp: bool = True) -> torch.Tensor:
    """log(pi / pi_old) `[batch, response_len]`, clamped to +-20 for a finite exp."""
    lr = log_prob - old_log_prob
    return lr.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP) if clamp else lr


def aggregate(
    pg_losses: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: Any,
    global_denominator: Denominator,
    rollout_is_weights: torch.Tensor | None,
) -> torch.Tensor:
    """Apply rollout IS weights, then `agg_loss` (with `actor.loss_scale_factor`)."""
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights.detach()
    return agg_loss(
        pg_losses, response_mask, loss_agg_mode, global_denominator, actor_cfg(config, "loss_scale_factor", None)
    )


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
