"""Schema of `algorithm`: advantage estimator, KL in reward, group filter, rollout correction."""

from __future__ import annotations

from dataclasses import dataclass

from megarl.config import names
from megarl.config.spec import Section, spec


@dataclass
class KLCtrlConfig(Section):
    type: str = spec(choices=names.kl_ctrl_types)
    kl_coef: float = spec(ge=0)
    horizon: int = spec(gt=0)
    target_kl: float = spec(gt=0)


@dataclass
class FilterGroupsConfig(Section):
    enable: bool = spec()
    metric: str = spec()  # names are checked at runtime against the reward's extra info
    max_num_gen_batches: int = spec(ge=0)


@dataclass
class RolloutCorrectionConfig(Section):
    rollout_is: str | None = spec(choices=names.rollout_is_levels)
    # "lower_upper" strings and comma lists are parsed by rules_algo.rollout_correction
    # with megarl.algorithms' own parsers.
    rollout_is_threshold: float | str = spec(gt=0)
    rollout_is_batch_normalize: bool = spec()
    rollout_rs: str | None = spec()
    rollout_rs_threshold: float | str | None = spec(gt=0)
    rollout_rs_threshold_lower: float | None = spec(gt=0)
    rollout_token_veto_threshold: float | None = spec(gt=0)
    bypass_mode: bool = spec()
    loss_type: str = spec(choices=names.rollout_corr_loss_types)


@dataclass
class AlgorithmConfig(Section):
    gamma: float = spec(ge=0, le=1)
    lam: float = spec(ge=0, le=1)
    adv_estimator: str = spec(choices=names.adv_estimators)
    norm_adv_by_std_in_grpo: bool = spec()
    gdpo_reward_keys: list[str] | None = spec()
    gdpo_reward_weights: list[float] | None = spec()
    use_kl_in_reward: bool = spec()
    kl_penalty: str = spec(choices=names.kl_penalties)
    kl_ctrl: KLCtrlConfig = spec()
    filter_groups: FilterGroupsConfig = spec()
    rollout_correction: RolloutCorrectionConfig = spec()
