"""Policy losses beyond PPO clip: gspo, sapo, cispo, geo_mean (GMPO), dppo_tv, dppo_kl,
dro, and bypass_mode (rollout log-probs as the old policy). Signature and metrics: see
`policy_loss_base`. Each respects `loss_agg_mode` except geo_mean, whose loss is
per-sequence by construction (always a mean over sequences)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from megarl.algorithms.agg import SEQ_UNIT_MODES, Denominator, GlobalDenominator, agg_loss
from megarl.algorithms.masked import masked_count, masked_sum
from megarl.algorithms.policy_loss_base import (
    aggregate,
    clip_range,
    log_ratio,
    pg_metrics,
    register_policy_loss,
)
from megarl.algorithms.policy_losses_ppo import compute_policy_loss_vanilla, ppo_clip_token_losses
from megarl.algorithms.registry import check_choice
from megarl.algorithms.rollout_correction import compute_offpolicy_metrics, rollout_weights_and_mask
from megarl.config.names import ROLLOUT_CORR_LOSS_TYPES

if TYPE_CHECKING:
    from megarl.config.schema.actor import ActorConfig
    from megarl.config.schema.algorithm import RolloutCorrectionConfig


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: ActorConfig,
    global_denominator: Denominator = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO (arXiv:2507.18071): PPO clip on the sequence-level ratio
    s_i = exp(mean_t log(pi/pi_old)), applied per token as sg(s_i) * pi_t / sg(pi_t) so the
    gradient flows through each token's log-prob. Config: clip_ratio_low/high (the paper
    uses ~3e-4 / 4e-4); the paper aggregates with loss_agg_mode=seq-mean-token-mean."""
    low, high = clip_range(config)
    lr = log_prob - old_log_prob
    valid = response_mask.bool()
    seq_lr = masked_sum(lr, valid, dim=-1) / masked_count(valid, dim=-1).clamp_min(1.0)
    token_log_ratio = log_prob - log_prob.detach() + seq_lr.detach().unsqueeze(-1)
    ratio = token_log_ratio.clamp(max=10.0).exp()
    loss, clipped, _ = ppo_clip_token_losses(ratio, advantages, low, high, None)
    pg_loss = aggregate(
        loss, response_mask, loss_agg_mode, config.loss_scale_factor, global_denominator, rollout_is_weights
    )
    return pg_loss, pg_metrics(response_mask, -lr, clipped)


@register_policy_loss("sapo")
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: ActorConfig,
    global_denominator: Denominator = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """SAPO (arXiv:2511.20347): soft gate instead of a hard clip,
    loss = -A * (4 / tau) * sigmoid(tau * (r - 1)), tau = tau_pos if A > 0 else tau_neg.
    At r = 1 its gradient equals the plain policy gradient. Config: tau_pos, tau_neg; the
    paper aggregates with loss_agg_mode=seq-mean-token-mean."""
    tau_pos = float(config.tau_pos)
    tau_neg = float(config.tau_neg)
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"actor_rollout_ref.actor.tau_pos / tau_neg must be > 0, got {tau_pos}, {tau_neg}")
    lr = log_ratio(log_prob, old_log_prob)
    tau = torch.where(advantages > 0, torch.full_like(advantages, tau_pos), torch.full_like(advantages, tau_neg))
    gate = torch.sigmoid(tau * (lr.exp() - 1.0)) * (4.0 / tau)
    loss = -gate * advantages
    pg_loss = aggregate(
        loss, response_mask, loss_agg_mode, config.loss_scale_factor, global_denominator, rollout_is_weights
    )
    return pg_loss, pg_metrics(response_mask, -lr)


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: ActorConfig,
    global_denominator: Denominator = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO (arXiv:2506.13585): loss = -sg(clip(r, 1 - low, 1 + high)) * A * log pi.
    Clipping the (detached) IS weight never drops a token's gradient, unlike PPO clip.
    Config: clip_ratio_low/high."""
    low, high = clip_range(config)
    lr = log_ratio(log_prob, old_log_prob)
    ratio = lr.exp()
    clipped_ratio = ratio.clamp(1.0 - low, 1.0 + high)
    loss = -clipped_ratio.detach() * advantages * log_prob
    pg_loss = aggregate(
        loss, response_mask, loss_agg_mode, config.loss_scale_factor, global_denominator, rollout_is_weights
    )
    return pg_loss, pg_metrics(response_mask, -lr, ratio != clipped_ratio)


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: ActorConfig,
    global_denominator: Denominator = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GMPO (arXiv:2507.20673): per sequence, loss_i = -mean_t(A) * exp(mean_t clip*(log r_t)),
    a geometric mean of token ratios; clip* clips log r to [-low, high] only on the side
    that helps the objective (min with sign(A)). Rollout IS weights enter as their
    geometric mean per sequence. Always a mean over sequences with a valid token, whatever
    loss_agg_mode: pass a `GlobalDenominator` (or a sequence count with a seq-mean-* mode)
    for micro-batch invariance. Config: clip_ratio_low/high (GMPO uses wider, e.g. 0.4)."""
    low, high = clip_range(config)
    if global_denominator is not None and not isinstance(global_denominator, GlobalDenominator):
        if loss_agg_mode not in SEQ_UNIT_MODES:
            raise ValueError(
                "geo_mean averages over sequences: pass global_denominator as a GlobalDenominator "
                f"(or a sequence count with a seq-mean-* loss_agg_mode), not a number with {loss_agg_mode}"
            )
    valid = response_mask.bool()
    lr = torch.where(valid, log_prob - old_log_prob, torch.zeros_like(log_prob))
    sign = torch.sign(advantages)
    lr_clamped = lr.clamp(-low, high)
    lr_used = sign * torch.minimum(sign * lr, sign * lr_clamped)
    lengths = masked_count(valid, dim=-1).clamp_min(1.0)
    seq_ratio = (masked_sum(lr_used, valid, dim=-1) / lengths).exp()
    seq_adv = masked_sum(advantages, valid, dim=-1) / lengths
    seq_loss = -seq_adv * seq_ratio
    if rollout_is_weights is not None:
        log_w = torch.log(rollout_is_weights.detach().clamp_min(1e-10))
        seq_loss = seq_loss * (masked_sum(log_w, valid, dim=-1) / lengths).exp()
    loss_mat = seq_loss.unsqueeze(-1).expand_as(log_prob)
    pg_loss = agg_loss(loss_mat, response_mask, "seq-mean-token-mean", global_denominator)
    clipped = lr != lr_clamped
    return pg_loss, pg_metrics(response_mask, -lr, clipped & (advantages > 0), clipped & (advantages < 0))


def _dppo_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: ActorConfig,
    global_denominator: Denominator,
    rollout_is_weights: torch.Tensor | None,
    divergence: str,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPPO (arXiv:2602.04879): keep -A * sg(min(r, clip_ratio_c)) * log pi only on tokens
    whose probability moved within a divergence trust region in the direction the
    advantage pushes; tokens outside get no gradient. clip_ratio_low/high are divergence
    thresholds here; clip_ratio_c truncates the IS ratio (the paper uses 20)."""
    low, high = clip_range(config)
    c = float(config.clip_ratio_c)
    lr = log_ratio(log_prob, old_log_prob)
    ratio = lr.exp()
    with torch.no_grad():
        p, p_old = log_prob.exp(), old_log_prob.exp()
        if divergence == "tv":
            ok_pos = (p - p_old) <= high
            ok_neg = (p - p_old) >= -low
        else:
            # KL between Bernoulli(p_old) and Bernoulli(p): the sampled token vs the rest.
            bkl = p_old * (old_log_prob - log_prob) + (1 - p_old) * torch.log((1 - p_old + 1e-8) / (1 - p + 1e-8))
            ok_pos = (bkl <= high) | (p <= p_old)
            ok_neg = (bkl <= low) | (p >= p_old)
        inside = torch.where(advantages > 0, ok_pos, ok_neg).float()
        truncated = ratio.clamp(max=c)
    loss = -advantages * truncated * log_prob * inside
    pg_loss = aggregate(
        loss, response_mask, loss_agg_mode, config.loss_scale_factor, global_denominator, rollout_is_weights
    )
    return pg_loss, pg_metrics(response_mask, -lr, 1.0 - inside, (ratio > c).float() * inside)


@register_policy_loss("dppo_tv")
def compute_policy_loss_dppo_tv(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: ActorConfig,
    global_denominator: Denominator = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPPO-Binary-TV: trust region |pi - pi_old| (signed: A > 0 needs pi - pi_old <= high,
    A <= 0 needs pi - pi_old >= -low). See `_dppo_loss`."""
    return _dppo_loss(
        old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, global_denominator,
        rollout_is_weights, "tv",
    )  # fmt: skip


@register_policy_loss("dppo_kl")
def compute_policy_loss_dppo_kl(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: ActorConfig,
    global_denominator: Denominator = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPPO-Binary-KL: trust region on the binary KL(Bern(pi_old) || Bern(pi)); a token
    is dropped only if it exceeds the bound while moving in the advantage's direction.
    See `_dppo_loss`."""
    return _dppo_loss(
        old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, global_denominator,
        rollout_is_weights, "kl",
    )  # fmt: skip


@register_policy_loss("dro")
def compute_policy_loss_dro(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: ActorConfig,
    global_denominator: Denominator = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DRO (Direct Reward Optimization): loss =
    -(A * log pi - beta/2 * (log pi - log pi_old)^2). Config: policy_loss.dro_beta (> 0, required)."""
    beta = config.policy_loss.dro_beta
    if beta is None or float(beta) <= 0:
        raise ValueError(f"actor_rollout_ref.actor.policy_loss.dro_beta must be > 0 for loss_mode=dro, got {beta}")
    lr = log_prob - old_log_prob
    loss = -(advantages * log_prob - 0.5 * float(beta) * lr.square())
    pg_loss = aggregate(
        loss, response_mask, loss_agg_mode, config.loss_scale_factor, global_denominator, rollout_is_weights
    )
    return pg_loss, pg_metrics(response_mask, -lr)


@register_policy_loss("bypass_mode")
def compute_policy_loss_bypass_mode(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: ActorConfig,
    global_denominator: Denominator = None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    rollout_correction: RolloutCorrectionConfig,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Bypass mode (`algorithm.rollout_correction.bypass_mode=true`): the controller skips
    the old-log-prob forward and passes rollout_log_probs as `old_log_prob`; the actor
    worker passes `algorithm.rollout_correction` as `rollout_correction` (the only loss
    that takes it).

    IS weights (pi / pi_rollout, from the current log_prob, detached) and rejection are
    computed here per micro-batch from rollout_correction's rollout_is*, rollout_rs* and
    rollout_token_veto_threshold. rollout_correction.loss_type: "ppo_clip" = vanilla PPO
    (config's clip keys) on the rejection mask (the PPO ratio already is pi / pi_rollout, so
    no extra weights); "reinforce" = -w * A * log pi. Rejected tokens contribute 0 but stay
    in any global denominator. `rollout_is_weights` passed in is ignored.
    """
    loss_type = rollout_correction.loss_type
    check_choice(loss_type, ROLLOUT_CORR_LOSS_TYPES, "bypass loss type", "algorithm.rollout_correction.loss_type")
    del rollout_is_weights
    with torch.no_grad():
        weights, mask, metrics = rollout_weights_and_mask(
            log_prob.detach() - old_log_prob, response_mask, rollout_correction
        )
        metrics.update(compute_offpolicy_metrics(log_prob, old_log_prob, response_mask))
    if loss_type == "ppo_clip":
        pg_loss, pg_m = compute_policy_loss_vanilla(
            old_log_prob, log_prob, advantages, mask, loss_agg_mode, config, global_denominator
        )
    else:
        loss = -advantages * log_prob
        pg_loss = aggregate(loss, mask, loss_agg_mode, config.loss_scale_factor, global_denominator, weights)
        pg_m = pg_metrics(mask, old_log_prob - log_prob)
    pg_m.update({f"rollout_corr/{k}": v for k, v in metrics.items()})
    return pg_loss, pg_m
