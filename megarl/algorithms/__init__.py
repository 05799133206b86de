"""RL algorithms as pure torch functions (no Ray / Megatron / vLLM).

Registries map config strings to functions and reject unknown names with the valid
list; the name views below (ADV_ESTIMATORS, POLICY_LOSSES) are live (they include later registrations).
The config names the built-ins in megarl.config.names (tests/config/test_names.py holds them equal).
"""

from megarl.algorithms.agg import (
    GlobalDenominator,
    agg_loss,
    combine_actor_loss,
    compute_entropy_loss,
    entropy_from_logits,
)
from megarl.algorithms.advantages import ADV_ESTIMATORS, get_adv_estimator, register_adv_estimator
from megarl.algorithms.compute_advantage import compute_advantage, needs_greedy_baselines
from megarl.algorithms.gae import discounted_returns, gae_advantages_returns
from megarl.algorithms.kl import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    compute_kl_loss,
    get_kl_controller,
    kl_penalty,
)
from megarl.algorithms.masked import masked_mean, masked_sum, masked_var, masked_whiten
from megarl.algorithms.policy_loss_base import POLICY_LOSSES, get_policy_loss, register_policy_loss
from megarl.algorithms import policy_losses_ppo as _ppo  # noqa: F401  (registers losses)
from megarl.algorithms import policy_losses_extra as _extra  # noqa: F401  (registers losses)
from megarl.algorithms.value import compute_value_loss, explained_variance
from megarl.algorithms.dapo import (
    BUILTIN_FILTER_METRICS,
    apply_overlong_penalty,
    filter_groups,
    filter_metric_values,
    overlong_penalty,
)
from megarl.algorithms.rollout_correction import compute_offpolicy_metrics, compute_rollout_correction

__all__ = [
    "ADV_ESTIMATORS",
    "BUILTIN_FILTER_METRICS",
    "apply_overlong_penalty",
    "compute_offpolicy_metrics",
    "compute_rollout_correction",
    "filter_groups",
    "filter_metric_values",
    "overlong_penalty",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "FixedKLController",
    "GlobalDenominator",
    "agg_loss",
    "apply_kl_penalty",
    "combine_actor_loss",
    "compute_advantage",
    "compute_entropy_loss",
    "compute_kl_loss",
    "compute_value_loss",
    "explained_variance",
    "discounted_returns",
    "entropy_from_logits",
    "gae_advantages_returns",
    "get_adv_estimator",
    "get_kl_controller",
    "get_policy_loss",
    "kl_penalty",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "needs_greedy_baselines",
    "register_adv_estimator",
    "register_policy_loss",
]
