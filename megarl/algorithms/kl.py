"""KL estimators between the policy and the reference, KL controllers, and the two
ways of using them: a penalty in the reward (`algorithm.use_kl_in_reward`) or a loss
term in the actor (`actor.use_kl_loss`). Estimators follow http://joschu.net/blog/kl-approx.html.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from megarl.algorithms.agg import Denominator, agg_loss
from megarl.algorithms.masked import masked_mean
from megarl.algorithms.registry import check_choice
from megarl.config.names import KL_CTRL_TYPES, KL_PENALTIES

if TYPE_CHECKING:
    from megarl.config.schema.algorithm import KLCtrlConfig


def _kl_forward(logprob: torch.Tensor, ref_logprob: torch.Tensor, mode: str) -> torch.Tensor:
    if mode in ("kl", "k1"):
        return logprob - ref_logprob
    if mode == "abs":
        return (logprob - ref_logprob).abs()
    if mode in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if mode in ("low_var_kl", "k3"):
        log_r = (ref_logprob - logprob).clamp(-20.0, 20.0)
        return (log_r.exp() - log_r - 1.0).clamp(-10.0, 10.0)
    if mode == "full":
        # Exact KL(pi || ref) from full distributions over the vocab: [..., vocab] -> [...].
        logp = torch.log_softmax(logprob.float(), dim=-1)
        logq = torch.log_softmax(ref_logprob.float(), dim=-1)
        return (logp.exp() * (logp - logq)).sum(dim=-1)
    raise AssertionError(mode)


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty_mode: str) -> torch.Tensor:
    """Per-token KL estimate between policy and reference.

    Args:
        logprob, ref_logprob: `[batch, response_len]` log-probs of the sampled tokens; for
            mode "full", `[batch, response_len, vocab]` logits or log-probs over the vocab.
        kl_penalty_mode (`algorithm.kl_penalty` / `actor.kl_loss_type`):
            kl|k1: log p - log q; abs: |log p - log q|; mse|k2: 0.5 (log p - log q)^2;
            low_var_kl|k3: q/p - log(q/p) - 1, clamped to [-10, 10]; full: exact KL over
            the vocab; suffix "+" (e.g. "k3+"): k2 gradient with the estimator's value.

    Returns: `[batch, response_len]`.
    """
    check_choice(kl_penalty_mode, KL_PENALTIES, "KL estimator", "algorithm.kl_penalty / actor.kl_loss_type")
    straight_through = kl_penalty_mode.endswith("+")
    mode = kl_penalty_mode.rstrip("+")
    value = _kl_forward(logprob, ref_logprob, mode)
    if not straight_through:
        return value
    k2 = 0.5 * (logprob - ref_logprob).square()
    return k2 - k2.detach() + value.detach()


class KLController(Protocol):
    value: float

    def update(self, current_kl: float, n_steps: int) -> None: ...


class FixedKLController:
    """Constant coefficient (`algorithm.kl_ctrl.type=fixed`, `kl_ctrl.kl_coef`)."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        del current_kl, n_steps


class AdaptiveKLController:
    """Proportional controller towards `target_kl` (Ziegler et al. 2019, arXiv:1909.08593).

    value *= 1 + clip(current_kl / target_kl - 1, -0.2, 0.2) * n_steps / horizon.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        if horizon <= 0:
            raise ValueError(f"algorithm.kl_ctrl.horizon must be > 0, got {horizon}")
        if target_kl <= 0:
            raise ValueError(f"algorithm.kl_ctrl.target_kl must be > 0, got {target_kl}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        error = float(np.clip(float(current_kl) / self.target - 1.0, -0.2, 0.2))
        self.value *= 1.0 + error * n_steps / self.horizon


def get_kl_controller(kl_ctrl: KLCtrlConfig) -> KLController:
    """Build a controller from `algorithm.kl_ctrl` (type, kl_coef; adaptive: target_kl, horizon)."""
    check_choice(kl_ctrl.type, KL_CTRL_TYPES, "KL controller", "algorithm.kl_ctrl.type")
    if kl_ctrl.type == "fixed":
        return FixedKLController(kl_ctrl.kl_coef)
    return AdaptiveKLController(kl_ctrl.kl_coef, kl_ctrl.target_kl, kl_ctrl.horizon)


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_probs: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_ctrl: KLController,
    kl_penalty_mode: str,
) -> tuple[torch.Tensor, dict[str, float]]:
    """In-reward KL: rewards = scores - beta * KL (per token), then `kl_ctrl.update`.

    Args: tensors `[batch, response_len]`; `kl_ctrl.value` is beta; kl_penalty_mode:
        `algorithm.kl_penalty` (see `kl_penalty`).
    Returns: token_level_rewards `[batch, response_len]` (scores at masked positions are
    kept as given), metrics {"actor/reward_kl_penalty": batch mean of per-sequence mean
    KL, "actor/reward_kl_penalty_coeff": beta used}. Side effect: the controller is
    updated with that KL and n_steps = batch size (as verl does).
    """
    kld = kl_penalty(old_log_probs, ref_log_prob, kl_penalty_mode)
    kld = torch.where(response_mask.bool(), kld, torch.zeros_like(kld))
    beta = kl_ctrl.value
    token_level_rewards = token_level_scores - beta * kld
    current_kl = masked_mean(kld, response_mask, dim=-1).mean().item()
    kl_ctrl.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    return token_level_rewards, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}


def compute_kl_loss(
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_loss_type: str,
    loss_agg_mode: str,
    global_denominator: Denominator = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """In-loss KL (`actor.use_kl_loss`): aggregated `kl_penalty(log_prob, ref, kl_loss_type)`.

    Args: tensors `[batch, response_len]`; kl_loss_type, loss_agg_mode, loss_scale_factor:
    `actor.kl_loss_type`, `actor.loss_agg_mode`, `actor.loss_scale_factor`.

    Returns (kl_loss scalar with grad, {"actor/kl_loss": value}); multiply by
    `actor.kl_loss_coef` (see `combine_actor_loss`).
    """
    kld = kl_penalty(log_prob, ref_log_prob, kl_loss_type)
    loss = agg_loss(kld, response_mask, loss_agg_mode, global_denominator, loss_scale_factor)
    return loss, {"actor/kl_loss": loss.detach().item()}
