"""One call for the trainer: pick the estimator named in the config and feed it the
batch fields it needs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from megarl.algorithms import optimal_token_baseline as _otb  # noqa: F401  (registers the estimator)
from megarl.algorithms.advantages import get_adv_estimator

if TYPE_CHECKING:
    from megarl.config.schema.algorithm import AlgorithmConfig

_TENSOR_FIELDS = ("values", "reward_baselines", "old_log_probs", "sum_pi_squared", "rollout_is_weights")
# Estimators that compare each response with the score of its prompt's greedy response
# (`reward_baselines`, which the rollout generates and scores for them).
GREEDY_BASELINE_ESTIMATORS = ("remax",)


def needs_greedy_baselines(algorithm_config: AlgorithmConfig) -> bool:
    """Whether `algorithm.adv_estimator` needs `reward_baselines` (one greedy response per prompt, scored)."""
    return algorithm_config.adv_estimator in GREEDY_BASELINE_ESTIMATORS


def _lookup(data: Any, key: str) -> Any:
    """Field `key` of a DataProto-like (`.batch` / `.non_tensor_batch`) or a Mapping; None if absent."""
    if isinstance(data, Mapping):
        return data[key] if key in data else None
    batch = getattr(data, "batch", None)
    if batch is not None and key in batch.keys():
        return batch[key]
    non_tensor = getattr(data, "non_tensor_batch", None) or {}
    return non_tensor[key] if key in non_tensor else None


def compute_advantage(data: Any, algorithm_config: AlgorithmConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns, each `[batch, response_len]`.

    data: DataProto-like or Mapping with `token_level_rewards`, `response_mask` and, per
        estimator, `values` (gae), `uid` (group-based), `reward_baselines` (remax),
        `old_log_probs` + `sum_pi_squared` (+ optional `rollout_is_weights`)
        (optimal_token_baseline), the `algorithm.gdpo_reward_keys` fields (gdpo).
    algorithm_config: `cfg.algorithm` (adv_estimator, gamma, lam, norm_adv_by_std_in_grpo,
        gdpo_reward_keys, gdpo_reward_weights), read by attribute.
    """
    name = algorithm_config.adv_estimator
    fn = get_adv_estimator(name)
    rewards = _lookup(data, "token_level_rewards")
    response_mask = _lookup(data, "response_mask")
    if rewards is None or response_mask is None:
        raise ValueError("compute_advantage needs batch['token_level_rewards'] and batch['response_mask']")
    kwargs: dict[str, Any] = {f: _lookup(data, f) for f in _TENSOR_FIELDS}
    kwargs["index"] = _lookup(data, "uid")
    if name == "gdpo":
        keys = algorithm_config.gdpo_reward_keys
        if not keys:
            raise ValueError("adv_estimator=gdpo needs algorithm.gdpo_reward_keys (reward components to normalize)")
        comps = {}
        for k in keys:
            v = _lookup(data, k)
            if v is None:
                raise ValueError(f"algorithm.gdpo_reward_keys names '{k}', which the batch does not contain")
            comps[k] = torch.as_tensor(np.asarray(v, dtype=np.float32), device=response_mask.device)
        kwargs["reward_components"] = comps
        weights = algorithm_config.gdpo_reward_weights
        kwargs["reward_weights"] = list(weights) if weights is not None else None
    return fn(
        rewards,
        response_mask,
        gamma=float(algorithm_config.gamma),
        lam=float(algorithm_config.lam),
        norm_adv_by_std_in_grpo=bool(algorithm_config.norm_adv_by_std_in_grpo),
        **kwargs,
    )
