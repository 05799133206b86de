"""Optimal Token Baseline (`algorithm.adv_estimator=optimal_token_baseline`).

A per-timestep baseline shared by the responses of one prompt:
    B_t = sum_i G_{i,t} W_{i,t} / sum_i W_{i,t},   W_{i,t} = sum_{j<=t} w_{i,j},
    w_{i,j} = (1 - 2 pi_{i,j} + sum_v pi_v^2) * rho_{i,j}^2,
where G is the reward-to-go, pi_{i,j} = exp(old_log_prob) of the sampled token, sum_v pi_v^2
comes from the actor (`actor.calculate_sum_pi_squared`) and rho are optional rollout IS
weights. w is the squared norm of the score function of the logits, a proxy of the
gradient variance, so high-variance paths weigh more in the baseline.
"""

from __future__ import annotations

from typing import Any

import torch

from megarl.algorithms.advantages import register_adv_estimator
from megarl.algorithms.gae import discounted_returns
from megarl.algorithms.groups import group_ids


@register_adv_estimator("optimal_token_baseline")
def compute_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    index: Any = None,
    old_log_probs: torch.Tensor | None = None,
    sum_pi_squared: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    otb_epsilon: float = 1e-8,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Args: `[batch, response_len]` tensors (right-padded responses); `index` = uids.

    handle_zero_tail: in a group whose longest response is strictly longer than all
    others, that response's baseline is 0 past the second-longest length (no other
    response informs it there).

    Returns: advantages = (G - B) * mask, returns = G, `[batch, response_len]`.
    """
    if old_log_probs is None or sum_pi_squared is None:
        raise ValueError(
            "optimal_token_baseline needs old_log_probs and sum_pi_squared "
            "(set actor_rollout_ref.actor.calculate_sum_pi_squared=true)"
        )
    with torch.no_grad():
        mf = response_mask.to(torch.float32)
        returns = discounted_returns(token_level_rewards, response_mask, 1.0)
        w = 1.0 - 2.0 * old_log_probs.float().exp() + sum_pi_squared.float()
        if rollout_is_weights is not None:
            w = w * rollout_is_weights.float() ** 2
        w_cum = torch.cumsum(torch.where(response_mask.bool(), w, torch.zeros_like(w)), dim=-1) * mf
        gid, n = group_ids(index, returns.device)
        size = torch.zeros(n, device=returns.device).index_add_(0, gid, torch.ones_like(gid, dtype=torch.float32))
        num = torch.zeros(n, returns.shape[1], device=returns.device).index_add_(0, gid, returns * w_cum)
        den = torch.zeros_like(num).index_add_(0, gid, w_cum)
        baseline = (num / (den + otb_epsilon))[gid]
        baseline = torch.where((size[gid] > 1).unsqueeze(-1), baseline, torch.zeros_like(baseline))
        if handle_zero_tail:
            lengths = mf.sum(dim=-1)
            positions = torch.arange(returns.shape[1], device=returns.device)
            for g in range(n):
                members = (gid == g).nonzero(as_tuple=True)[0]
                if members.numel() < 2:
                    continue
                lens = lengths[members]
                top = torch.topk(lens, 2).values
                if top[0] > top[1]:
                    longest = members[int(torch.argmax(lens))]
                    baseline[longest] = torch.where(positions >= top[1], 0.0, baseline[longest])
        advantages = (returns - baseline) * mf
    return advantages, returns
