"""Rollout correction (`algorithm.rollout_correction.*`): the rollout engine (vLLM, bf16,
maybe a stale policy) samples from pi_rollout, the trainer computes pi_old. This module
gives importance weights pi_old / pi_rollout (truncated), rejection of outlier tokens or
sequences, and diagnostics of the gap. All inputs are `[batch, response_len]`; all weights
and masks are detached.

Threshold specs (verl's):
  rollout_is_threshold: float / "2.0" = truncate weights at the upper bound (TIS);
      "lower_upper" (e.g. "0.5_2.0") = zero weights outside [lower, upper] (IcePop).
  rollout_rs_threshold: one spec per comma-separated rollout_rs option (or one shared):
      ratio options (token, sequence, geometric) and *_k1 options take ratio bounds
      "lower_upper" (a single value u means 1/u_u; for ratio options
      rollout_rs_threshold_lower, when set, replaces the lower bound);
      other options take one upper bound on the divergence.
  rollout_token_veto_threshold: reject a whole sequence if any token ratio is below it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from megarl.algorithms.masked import masked_count, masked_mean, masked_sum
from megarl.algorithms.registry import check_choice
from megarl.config.names import ROLLOUT_IS_LEVELS, ROLLOUT_RS_OPTIONS, ROLLOUT_RS_RATIO_OPTIONS
from megarl.config.schema.algorithm import parse_is_threshold, parse_rs_thresholds

if TYPE_CHECKING:
    from megarl.config.schema.algorithm import RolloutCorrectionConfig

SAFETY_BOUND = 20.0  # |log ratio| clamp before exp
_KEY = "algorithm.rollout_correction."


def _seq_valid(response_mask: torch.Tensor) -> torch.Tensor:
    return masked_count(response_mask, dim=-1) > 0


def compute_rollout_is_weights(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str,
    rollout_is_threshold: float | str,
    rollout_is_batch_normalize: bool,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Importance weights `[batch, response_len]` from log(pi_old / pi_rollout).

    rollout_is: token = per-token ratio; sequence = product over the sequence;
        geometric = geometric mean over the sequence (exp of the mean log ratio).
    Weights are truncated (TIS) or zeroed outside bounds (IcePop), 0 at masked positions,
    optionally divided by their batch mean (`rollout_is_batch_normalize`; token mean for
    token level, sequence mean otherwise), and detached.

    Metrics (unprefixed): rollout_is_mean/std/max/min (of applied weights),
    rollout_is_ratio_fraction_high/low (raw weights beyond the bounds; lower bound =
    1/upper for TIS), rollout_is_eff_sample_size = (mean w)^2 / mean(w^2) in (0, 1]
    (per token for token level, per sequence otherwise), rollout_is_batch_norm_factor.
    """
    check_choice(rollout_is, ROLLOUT_IS_LEVELS, "rollout_is level", _KEY + "rollout_is")
    upper, lower = parse_is_threshold(rollout_is_threshold)
    mask = response_mask.bool()
    lr = torch.where(mask, log_ratio.detach().float(), torch.zeros_like(log_ratio, dtype=torch.float32))

    def truncate(raw: torch.Tensor) -> torch.Tensor:
        if lower is None:
            return raw.clamp(max=upper)
        return torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw))

    # Weights and their statistics at the level's own unit: tokens, or one per valid sequence.
    if rollout_is == "token":
        unit_mask = mask
        raw_u = lr.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp() * mask
        w_u = truncate(raw_u)
        weights = w_u
    else:
        unit_mask = _seq_valid(mask)
        seq_lr = lr.sum(-1) if rollout_is == "sequence" else masked_mean(lr, mask, dim=-1)
        raw_u = seq_lr.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp() * unit_mask
        w_u = truncate(raw_u)
        weights = w_u.unsqueeze(-1) * mask
    low_bound = lower if lower is not None else 1.0 / upper
    mean_w = masked_mean(w_u, unit_mask)
    mean_sq = masked_mean(w_u**2, unit_mask)
    metrics = {
        "rollout_is_mean": mean_w.item(),
        "rollout_is_std": (mean_sq - mean_w**2).clamp_min(0).sqrt().item(),
        "rollout_is_max": w_u.masked_fill(~unit_mask, -math.inf).max().item() if unit_mask.any() else 0.0,
        "rollout_is_min": w_u.masked_fill(~unit_mask, math.inf).min().item() if unit_mask.any() else 0.0,
        "rollout_is_ratio_fraction_high": masked_mean((raw_u > upper).float(), unit_mask).item(),
        "rollout_is_ratio_fraction_low": masked_mean((raw_u < low_bound).float(), unit_mask).item(),
        "rollout_is_eff_sample_size": (mean_w**2 / mean_sq).item() if mean_sq > 0 else 0.0,
    }
    if rollout_is_batch_normalize:
        factor = mean_w.item()
        if factor > 1e-8:
            weights = weights / factor
        metrics["rollout_is_batch_norm_factor"] = factor if factor > 1e-8 else 1.0
    return weights.detach(), metrics


def compute_rollout_rejection_mask(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_rs: str,
    rollout_rs_threshold: float | str | None,
    rollout_rs_threshold_lower: float | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Reject tokens / whole sequences whose divergence between pi_old and pi_rollout is
    out of bounds. Returns (new response_mask with rejected positions 0, same dtype;
    metrics).

    rollout_rs: comma-separated options, all must pass. With lr = log(pi_old / pi_rollout):
    token / sequence / geometric keep lower <= ratio <= upper for the token ratio exp(lr),
    the sequence product exp(sum lr) or the geometric mean exp(mean lr) (sequence levels
    reject whole sequences). Per token, k1 = -lr, k2 = lr^2 / 2, k3 = exp(lr) - 1 - lr. token_kX tests each token;
    seq_sum_kX / seq_mean_kX / seq_max_kX test the sum / mean / max over the sequence and
    reject the whole sequence. k1 options keep log(lower) <= stat <= log(upper); others
    keep stat <= upper.
    Metrics: rollout_rs_<opt>_masked_fraction (tokens) and _seq_masked_fraction, overall
    rollout_rs_masked_fraction and rollout_rs_seq_masked_fraction (of valid sequences).
    """
    options = list(dict.fromkeys(o.strip() for o in str(rollout_rs).split(",") if o.strip()))
    if not options:
        raise ValueError(f"{_KEY}rollout_rs is empty")
    for opt in options:
        check_choice(opt, ROLLOUT_RS_OPTIONS, "rollout_rs option", _KEY + "rollout_rs")
    bounds = parse_rs_thresholds(options, rollout_rs_threshold)
    if rollout_rs_threshold_lower is not None:
        for opt in options:
            if opt in ROLLOUT_RS_RATIO_OPTIONS:
                if not 0 < rollout_rs_threshold_lower <= bounds[opt][1]:
                    raise ValueError(
                        f"{_KEY}rollout_rs_threshold_lower={rollout_rs_threshold_lower} "
                        f"must be in (0, upper={bounds[opt][1]}]"
                    )
                bounds[opt] = (rollout_rs_threshold_lower, bounds[opt][1])
    mask = response_mask.bool()
    lr = torch.where(mask, log_ratio.detach().float(), torch.zeros_like(log_ratio, dtype=torch.float32))
    lr = lr.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    per_token = {"k1": -lr, "k2": 0.5 * lr**2, "k3": lr.exp() - 1.0 - lr}
    seq_valid = _seq_valid(mask)
    keep_all = torch.ones_like(mask)
    metrics: dict[str, float] = {}
    for opt in options:
        level, k = opt.rsplit("_", 1) if "_" in opt else (opt, "")
        stat = per_token[k] if k else lr
        if level == "sequence":
            stat = masked_sum(lr, mask, dim=-1).unsqueeze(-1)
        elif level == "geometric":
            stat = masked_mean(lr, mask, dim=-1).unsqueeze(-1)
        elif level == "seq_sum":
            stat = masked_sum(stat, mask, dim=-1).unsqueeze(-1)
        elif level == "seq_mean":
            stat = masked_mean(stat, mask, dim=-1).unsqueeze(-1)
        elif level == "seq_max":
            stat = stat.masked_fill(~mask, -math.inf).max(dim=-1, keepdim=True).values
        lower, upper = bounds[opt]
        if lower is not None:
            keep = (stat >= math.log(lower)) & (stat <= math.log(upper))
        else:
            keep = stat <= upper
        keep = keep.expand_as(mask) | ~mask
        keep_all &= keep
        metrics[f"rollout_rs_{opt}_masked_fraction"] = masked_mean((~keep).float(), mask).item()
        metrics[f"rollout_rs_{opt}_seq_masked_fraction"] = masked_mean((~keep).any(-1).float(), seq_valid).item()
    metrics["rollout_rs_masked_fraction"] = masked_mean((~keep_all).float(), mask).item()
    metrics["rollout_rs_seq_masked_fraction"] = masked_mean((~keep_all).any(-1).float(), seq_valid).item()
    new_mask = (response_mask * keep_all.to(response_mask.dtype)).to(response_mask.dtype)
    return new_mask, metrics


def apply_token_veto(
    log_ratio: torch.Tensor, response_mask: torch.Tensor, rollout_token_veto_threshold: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Reject whole sequences containing a token with pi_old / pi_rollout below the
    threshold (`rollout_token_veto_threshold`). Returns (new response_mask, metrics
    rollout_is_veto_fraction (of valid sequences), rollout_is_catastrophic_token_fraction)."""
    if rollout_token_veto_threshold <= 0:
        raise ValueError(f"{_KEY}rollout_token_veto_threshold must be > 0, got {rollout_token_veto_threshold}")
    mask = response_mask.bool()
    bad = (log_ratio.detach() < math.log(rollout_token_veto_threshold)) & mask
    vetoed = bad.any(dim=-1, keepdim=True)
    metrics = {
        "rollout_is_veto_fraction": masked_mean(vetoed.squeeze(-1).float(), _seq_valid(mask)).item(),
        "rollout_is_catastrophic_token_fraction": masked_mean(bad.float(), mask).item(),
    }
    return (response_mask * (~vetoed).to(response_mask.dtype)).to(response_mask.dtype), metrics


def compute_offpolicy_metrics(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """Diagnostics of the training/rollout gap (sequence averages over valid sequences):
    kl = mean(log pi_rollout - log pi_old) (tokens), k3_kl, training_ppl / rollout_ppl
    (mean of per-sequence exp(-mean log p)), their logs, log_ppl_diff (+abs, max, min),
    ppl_ratio, chi2_token = E[rho^2] - 1, chi2_seq = E[(prod rho)^2] - 1, rho = pi_old / pi_rollout.
    """
    mask = response_mask.bool()
    seq_valid = _seq_valid(mask)
    old = torch.where(mask, old_log_prob.detach().float(), torch.zeros_like(old_log_prob, dtype=torch.float32))
    roll = torch.where(mask, rollout_log_prob.detach().float(), torch.zeros_like(old))
    lr = old - roll
    mean_old = masked_mean(old, mask, dim=-1)
    mean_roll = masked_mean(roll, mask, dim=-1)
    log_ppl_diff = mean_roll - mean_old
    rho = lr.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()
    seq_log_rho = masked_sum(lr, mask, dim=-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)

    def seq_mean(x: torch.Tensor) -> float:
        return masked_mean(x, seq_valid).item()

    valid_diff = log_ppl_diff[seq_valid]
    return {
        "kl": masked_mean(roll - old, mask).item(),
        "k3_kl": masked_mean(rho - lr - 1.0, mask).item(),
        "training_ppl": seq_mean((-mean_old).exp()),
        "training_log_ppl": seq_mean(-mean_old),
        "rollout_ppl": seq_mean((-mean_roll).exp()),
        "rollout_log_ppl": seq_mean(-mean_roll),
        "log_ppl_diff": seq_mean(log_ppl_diff),
        "log_ppl_abs_diff": seq_mean(log_ppl_diff.abs()),
        "log_ppl_diff_max": valid_diff.max().item() if valid_diff.numel() else 0.0,
        "log_ppl_diff_min": valid_diff.min().item() if valid_diff.numel() else 0.0,
        "ppl_ratio": seq_mean(log_ppl_diff.exp()),
        "chi2_token": masked_mean(rho**2, mask).item() - 1.0,
        "chi2_seq": seq_mean((2.0 * seq_log_rho).exp()) - 1.0,
    }


def compute_rollout_correction(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_correction_config: RolloutCorrectionConfig,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """Decoupled-mode entry point for the trainer.

    Reads `algorithm.rollout_correction.{rollout_is, rollout_is_threshold,
    rollout_is_batch_normalize, rollout_rs, rollout_rs_threshold (null: rollout_is_threshold),
    rollout_rs_threshold_lower, rollout_token_veto_threshold}` and returns
    (rollout_is_weights `[batch, response_len]` or None when rollout_is is null,
    response_mask with rejected positions zeroed, metrics prefixed "rollout_corr/").
    Store the weights as batch['rollout_is_weights'] and pass them to the policy loss.
    """
    if old_log_prob.shape != rollout_log_prob.shape or old_log_prob.shape != response_mask.shape:
        raise ValueError(
            f"rollout correction: old_log_probs {tuple(old_log_prob.shape)}, rollout_log_probs "
            f"{tuple(rollout_log_prob.shape)} and response_mask {tuple(response_mask.shape)} must match"
        )
    weights, new_mask, metrics = rollout_weights_and_mask(
        old_log_prob - rollout_log_prob, response_mask, rollout_correction_config
    )
    metrics.update(compute_offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask))
    return weights, new_mask, {f"rollout_corr/{k}": v for k, v in metrics.items()}


def rollout_weights_and_mask(
    log_ratio: torch.Tensor, response_mask: torch.Tensor, cfg: RolloutCorrectionConfig
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """IS weights (or None), rejected+vetoed mask and unprefixed metrics for
    log_ratio = log(pi_train / pi_rollout), configured by `algorithm.rollout_correction`
    (`cfg`: rollout_is, rollout_is_threshold, rollout_is_batch_normalize, rollout_rs,
    rollout_rs_threshold, rollout_rs_threshold_lower, rollout_token_veto_threshold)."""
    metrics: dict[str, float] = {}
    weights = None
    if cfg.rollout_is is not None:
        weights, m = compute_rollout_is_weights(
            log_ratio, response_mask, cfg.rollout_is, cfg.rollout_is_threshold, bool(cfg.rollout_is_batch_normalize)
        )
        metrics.update(m)
    new_mask = response_mask
    if cfg.rollout_rs is not None:
        rs_threshold = cfg.rollout_rs_threshold
        ratio_only = all(o.strip() in ROLLOUT_RS_RATIO_OPTIONS for o in str(cfg.rollout_rs).split(",") if o.strip())
        if rs_threshold is None and ratio_only:
            rs_threshold = cfg.rollout_is_threshold  # ratio options share the IS bound unless set
        new_mask, m = compute_rollout_rejection_mask(
            log_ratio, response_mask, cfg.rollout_rs, rs_threshold, cfg.rollout_rs_threshold_lower
        )
        metrics.update(m)
    if cfg.rollout_token_veto_threshold is not None:
        new_mask, m = apply_token_veto(log_ratio, new_mask, float(cfg.rollout_token_veto_threshold))
        metrics.update(m)
    return weights, new_mask, metrics
