"""PPO-family policy losses: vanilla (clip / asymmetric clip / dual-clip), clip_cov,
kl_cov, gpg. Signature and metrics: see `policy_loss_base`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from megarl.algorithms.agg import Denominator
from megarl.algorithms.masked import masked_mean
from megarl.algorithms.policy_loss_base import (
    aggregate,
    clip_range,
    log_ratio,
    pg_metrics,
    register_policy_loss,
)

if TYPE_CHECKING:
    from megarl.config.schema.actor import ActorConfig


def ppo_clip_token_losses(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float, clip_ratio_c: float | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO loss `[batch, response_len]` and (clipped, clipped_lower) indicators.

    max(-A r, -A clip(r, 1-low, 1+high)); with dual-clip (clip_ratio_c, Ye et al. 2019,
    arXiv:1912.09729) negative-advantage tokens are further capped at -A * clip_ratio_c.
    """
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    clipped = loss_clipped > loss_unclipped
    clipped_lower = torch.zeros_like(clipped)
    if clip_ratio_c is not None:
        cap = -advantages * clip_ratio_c
        clipped_lower = (loss > cap) & (advantages < 0)
        loss = torch.where(advantages < 0, torch.minimum(loss, cap), loss)
    return loss, clipped, clipped_lower


def _clip_ratio_c(config: ActorConfig) -> float:
    c = float(config.clip_ratio_c)
    if c <= 1.0:
        raise ValueError(f"actor_rollout_ref.actor.clip_ratio_c must be > 1.0 (dual-clip bound), got {c}")
    return c


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: ActorConfig,
    global_denominator: Denominator = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with asymmetric clip (clip_ratio_low/high) and dual-clip
    (clip_ratio_c). Config: clip_ratio, clip_ratio_low, clip_ratio_high, clip_ratio_c."""
    low, high = clip_range(config)
    lr = log_ratio(log_prob, old_log_prob)
    loss, clipped, clipped_lower = ppo_clip_token_losses(lr.exp(), advantages, low, high, _clip_ratio_c(config))
    pg_loss = aggregate(
        loss, response_mask, loss_agg_mode, config.loss_scale_factor, global_denominator, rollout_is_weights
    )
    return pg_loss, pg_metrics(response_mask, -lr, clipped, clipped_lower)


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: ActorConfig,
    global_denominator: Denominator = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GPG (arXiv:2504.02546): plain policy gradient, loss = -A * log pi."""
    loss = -advantages * log_prob
    pg_loss = aggregate(
        loss, response_mask, loss_agg_mode, config.loss_scale_factor, global_denominator, rollout_is_weights
    )
    return pg_loss, pg_metrics(response_mask, (old_log_prob - log_prob))


def _token_covariance(advantages: torch.Tensor, log_prob: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Centered product (A - mean A)(log pi - mean log pi) over valid tokens, detached."""
    a = advantages.detach().float()
    lp = log_prob.detach().float()
    return (a - masked_mean(a, response_mask)) * (lp - masked_mean(lp, response_mask))


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: ActorConfig,
    global_denominator: Denominator = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip-Cov (arXiv:2505.22617): PPO clip, plus the gradient of a random
    `policy_loss.clip_cov_ratio` fraction (at least 1) of the valid, not-already-clipped
    tokens whose covariance lies in (clip_cov_lb, clip_cov_ub) is cut (loss * 0).
    Config: clip_ratio*, policy_loss.clip_cov_ratio, policy_loss.clip_cov_lb, policy_loss.clip_cov_ub."""
    ratio_frac = float(config.policy_loss.clip_cov_ratio)
    lb = float(config.policy_loss.clip_cov_lb)
    ub = float(config.policy_loss.clip_cov_ub)
    if ratio_frac <= 0:
        raise ValueError(f"actor_rollout_ref.actor.policy_loss.clip_cov_ratio must be > 0, got {ratio_frac}")
    low, high = clip_range(config)
    lr = log_ratio(log_prob, old_log_prob)
    loss, clipped, _ = ppo_clip_token_losses(lr.exp(), advantages, low, high, None)
    valid = response_mask.bool()
    cov = _token_covariance(advantages, log_prob, response_mask)
    candidates = ((cov > lb) & (cov < ub) & valid & ~clipped).nonzero()
    n_clip = max(int(ratio_frac * int(valid.sum())), 1)
    keep = torch.ones_like(loss)
    if len(candidates) > 0:
        chosen = candidates[torch.randperm(len(candidates), device=candidates.device)[:n_clip]]
        keep[chosen[:, 0], chosen[:, 1]] = 0.0
    pg_loss = aggregate(
        loss * keep, response_mask, loss_agg_mode, config.loss_scale_factor, global_denominator, rollout_is_weights
    )
    return pg_loss, pg_metrics(response_mask, -lr, keep == 0)


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: ActorConfig,
    global_denominator: Denominator = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-Cov (arXiv:2505.22617): unclipped -A r, plus `policy_loss.ppo_kl_coef * |log r|`
    on the top `policy_loss.kl_cov_ratio` fraction (at least 1) of valid tokens by
    covariance. Config: policy_loss.kl_cov_ratio, policy_loss.ppo_kl_coef."""
    ratio_frac = float(config.policy_loss.kl_cov_ratio)
    kl_coef = float(config.policy_loss.ppo_kl_coef)
    if ratio_frac <= 0:
        raise ValueError(f"actor_rollout_ref.actor.policy_loss.kl_cov_ratio must be > 0, got {ratio_frac}")
    lr = log_ratio(log_prob, old_log_prob)
    loss = -advantages * lr.exp()
    valid = response_mask.bool()
    n_valid = int(valid.sum())
    penalized = torch.zeros_like(valid)
    if n_valid > 0:
        cov = _token_covariance(advantages, log_prob, response_mask).masked_fill(~valid, float("-inf"))
        k = max(1, int(n_valid * ratio_frac))
        top = torch.topk(cov.flatten(), k).indices
        penalized.view(-1)[top] = True
    loss = torch.where(penalized, loss + kl_coef * lr.abs(), loss)
    pg_loss = aggregate(
        loss, response_mask, loss_agg_mode, config.loss_scale_factor, global_denominator, rollout_is_weights
    )
    kl_abs = masked_mean(lr.detach().abs(), response_mask).item()
    return pg_loss, pg_metrics(response_mask, -lr, penalized, **{"actor/ppo_kl_abs": kl_abs})
