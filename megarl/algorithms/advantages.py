"""Advantage estimators (`algorithm.adv_estimator`).

Every estimator has the signature

    fn(token_level_rewards [batch, response_len], response_mask [batch, response_len], *,
       index=None, values=None, gamma, lam, norm_adv_by_std_in_grpo,
       epsilon=1e-6, reward_baselines=None, **extra)
       -> (advantages [batch, response_len], returns [batch, response_len])

and ignores the keywords it does not use. gamma, lam, norm_adv_by_std_in_grpo are
`algorithm.*` values with no default here (the yaml holds the defaults); an estimator that uses one
requires it. `index` is the array of prompt uids (length
batch; the n responses of one prompt share a uid). Outcome estimators sum each
response's token rewards into one score and broadcast the advantage over its valid
tokens. All outputs are 0 at masked positions. No gradients flow.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from megarl.algorithms.gae import discounted_returns, gae_advantages_returns
from megarl.algorithms.groups import group_ids, group_mean_std
from megarl.algorithms.masked import masked_count, masked_whiten
from megarl.algorithms.registry import Registry

AdvantageFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
ADV_ESTIMATOR_REGISTRY: Registry[AdvantageFn] = Registry("advantage estimator", "algorithm.adv_estimator")
ADV_ESTIMATORS = ADV_ESTIMATOR_REGISTRY.names()
register_adv_estimator = ADV_ESTIMATOR_REGISTRY.register
get_adv_estimator = ADV_ESTIMATOR_REGISTRY.get


def _masked_scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Per-response outcome score `[batch]` = sum of rewards over valid tokens."""
    m = response_mask.bool()
    return torch.where(m, token_level_rewards, torch.zeros_like(token_level_rewards)).sum(dim=-1)


def _broadcast(scalars: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    return scalars.unsqueeze(-1) * response_mask.to(scalars.dtype)


@register_adv_estimator("gae")
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    values: torch.Tensor | None = None,
    gamma: float,
    lam: float,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE (`algorithm.gamma`, `algorithm.lam`) with critic `values`; advantages are then
    whitened over the batch's valid tokens; returns = raw advantages + values."""
    if values is None:
        raise ValueError("adv_estimator=gae needs critic values (batch['values']); is the critic enabled?")
    advantages, returns = gae_advantages_returns(token_level_rewards, values, response_mask, gamma, lam)
    return masked_whiten(advantages, response_mask), returns


@register_adv_estimator("grpo")
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    index: Any = None,
    norm_adv_by_std_in_grpo: bool,
    epsilon: float = 1e-6,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: (score - group mean) / (group std + epsilon); with
    `algorithm.norm_adv_by_std_in_grpo=false` no std division (Dr.GRPO, arXiv:2503.20783)."""
    with torch.no_grad():
        scores = _masked_scores(token_level_rewards, response_mask)
        gid, n = group_ids(index, scores.device)
        mean, std, _count = group_mean_std(scores, gid, n)
        adv = scores - mean
        if norm_adv_by_std_in_grpo:
            adv = adv / (std + epsilon)
        adv = _broadcast(adv, response_mask)
    return adv, adv


@register_adv_estimator("grpo_passk")
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    index: Any = None,
    norm_adv_by_std_in_grpo: bool,
    epsilon: float = 1e-6,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k GRPO (arXiv:2503.19595): only the best response of each group gets a
    non-zero advantage, r_max - r_second_max (divided by group std + epsilon when
    `norm_adv_by_std_in_grpo`). Ties go to the first best. Groups need >= 2 responses."""
    with torch.no_grad():
        scores = _masked_scores(token_level_rewards, response_mask)
        gid, n = group_ids(index, scores.device)
        _mean, std, count = group_mean_std(scores, gid, n)
        adv = torch.zeros_like(scores)
        for g in range(n):
            members = (gid == g).nonzero(as_tuple=True)[0]
            if members.numel() < 2:
                raise ValueError(f"grpo_passk needs >= 2 responses per prompt (rollout.n >= 2); uid group {g} has 1")
            top = torch.topk(scores[members], 2)
            value = top.values[0] - top.values[1]
            if norm_adv_by_std_in_grpo:
                value = value / (std[members[0]] + epsilon)
            adv[members[top.indices[0]]] = value
        adv = _broadcast(adv, response_mask)
    return adv, adv


@register_adv_estimator("rloo")
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, *, index: Any = None, **_: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (arXiv:2402.14740): score - mean of the other responses of the same prompt
    (= n/(n-1) * (score - group mean)); a lone response keeps its score."""
    with torch.no_grad():
        scores = _masked_scores(token_level_rewards, response_mask)
        gid, n = group_ids(index, scores.device)
        mean, _std, count = group_mean_std(scores, gid, n)
        loo = torch.where(count > 1, (scores - mean) * count / (count - 1).clamp_min(1.0), scores)
        adv = _broadcast(loo, response_mask)
    return adv, adv


@register_adv_estimator("reinforce_plus_plus_baseline")
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, *, index: Any = None, **_: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline (arXiv:2501.03262): score - group mean, broadcast, then
    whitened over all valid tokens of the batch."""
    with torch.no_grad():
        scores = _masked_scores(token_level_rewards, response_mask)
        gid, n = group_ids(index, scores.device)
        mean, _std, _count = group_mean_std(scores, gid, n)
        adv = masked_whiten(_broadcast(scores - mean, response_mask), response_mask)
    return adv, adv


@register_adv_estimator("reinforce_plus_plus")
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, *, gamma: float, **_: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (arXiv:2501.03262): discounted return-to-go (`algorithm.gamma`),
    whitened over the batch's valid tokens. Returns are the raw discounted returns."""
    returns = discounted_returns(token_level_rewards, response_mask, gamma)
    return masked_whiten(returns, response_mask), returns


@register_adv_estimator("remax")
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    reward_baselines: torch.Tensor | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (arXiv:2310.10505): reward-to-go minus the reward of the greedy response to
    the same prompt (`reward_baselines` `[batch]`, produced by the trainer)."""
    if reward_baselines is None:
        raise ValueError("adv_estimator=remax needs reward_baselines (rewards of greedy responses)")
    with torch.no_grad():
        returns = discounted_returns(token_level_rewards, response_mask, 1.0)
        adv = returns - _broadcast(reward_baselines.to(returns.dtype), response_mask)
    return adv, returns


@register_adv_estimator("opo")
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, *, index: Any = None, **_: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO (arXiv:2505.23585): baseline = length-weighted mean score of the group,
    sum(len_j * score_j) / sum(len_j); a lone response keeps its score."""
    with torch.no_grad():
        scores = _masked_scores(token_level_rewards, response_mask).to(torch.float64)
        lengths = masked_count(response_mask, dim=-1).to(torch.float64)
        gid, n = group_ids(index, scores.device)
        num = torch.zeros(n, dtype=torch.float64, device=scores.device).index_add_(0, gid, lengths * scores)
        den = torch.zeros_like(num).index_add_(0, gid, lengths)
        size = torch.zeros_like(num).index_add_(0, gid, torch.ones_like(scores))
        baseline = torch.where(size > 1, num / den.clamp_min(1e-12), torch.zeros_like(num))[gid]
        adv = _broadcast((scores - baseline).to(token_level_rewards.dtype), response_mask)
    return adv, adv


@register_adv_estimator("gpg")
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    index: Any = None,
    f_norm: float = 1.0,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG (arXiv:2504.02546): alpha * (score - group mean) / f_norm with
    alpha = batch / max(1, #responses with non-zero score) (corrects for all-zero groups)."""
    with torch.no_grad():
        scores = _masked_scores(token_level_rewards, response_mask)
        gid, n = group_ids(index, scores.device)
        mean, _std, _count = group_mean_std(scores, gid, n)
        alpha = scores.shape[0] / max(1, int(torch.count_nonzero(scores)))
        adv = _broadcast(alpha * (scores - mean) / f_norm, response_mask)
    return adv, adv


@register_adv_estimator("gdpo")
def compute_gdpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    index: Any = None,
    norm_adv_by_std_in_grpo: bool,
    epsilon: float = 1e-6,
    reward_components: dict[str, torch.Tensor] | list[torch.Tensor] | None = None,
    reward_weights: list[float] | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO (arXiv:2601.05242): GRPO-normalize each reward component within its group
    separately, take the weighted sum (`algorithm.gdpo_reward_weights`, default all 1),
    then whiten over the batch's valid tokens.

    reward_components: per-response scores `[batch]` per component (values of the keys
    `algorithm.gdpo_reward_keys` in reward_extra_info), as a dict or list; None = use the
    summed token_level_rewards as the only component.
    """
    with torch.no_grad():
        if reward_components is None:
            comps = [_masked_scores(token_level_rewards, response_mask)]
        else:
            comps = list(reward_components.values()) if isinstance(reward_components, dict) else list(reward_components)
            comps = [torch.as_tensor(c, dtype=torch.float32, device=response_mask.device) for c in comps]
        weights = [1.0] * len(comps) if reward_weights is None else list(reward_weights)
        if len(weights) != len(comps):
            raise ValueError(
                f"algorithm.gdpo_reward_weights has {len(weights)} entries but there are {len(comps)} reward components"
            )
        gid, n = group_ids(index, response_mask.device)
        total = torch.zeros(response_mask.shape[0], dtype=torch.float32, device=response_mask.device)
        for w, c in zip(weights, comps):
            mean, std, _count = group_mean_std(c, gid, n)
            a = c - mean
            if norm_adv_by_std_in_grpo:
                a = a / (std + epsilon)
            total = total + w * a
        adv = masked_whiten(_broadcast(total, response_mask), response_mask)
    return adv, adv
