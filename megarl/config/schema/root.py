"""The typed config tree: the keys megarl implements (defaults live in the yaml; the verl keys
megarl accepts without implementing are in verl_compat.accepted_keys)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from megarl.config.schema.actor import ActorRolloutRefConfig
from megarl.config.schema.algorithm import AlgorithmConfig
from megarl.config.schema.critic import CriticConfig
from megarl.config.schema.data import DataConfig
from megarl.config.schema.reward import LegacyCustomRewardFunctionConfig, LegacyRewardModelConfig, RewardConfig
from megarl.config.schema.trainer import RayKwargsConfig, TrainerConfig
from megarl.config.schema.field import Section, spec


@dataclass
class MegaRLConfig(Section):
    """Root of `megarl/configs/megatron/ppo_megatron_trainer.yaml`."""

    model_engine: Literal["megatron"] = spec(note="megarl trains with Megatron-Core only (verl's dp / torchtitan / veomni engines are not available)")
    data: DataConfig = spec()
    actor_rollout_ref: ActorRolloutRefConfig = spec()
    critic: CriticConfig = spec()
    reward: RewardConfig = spec()
    custom_reward_function: LegacyCustomRewardFunctionConfig = spec()
    reward_model: LegacyRewardModelConfig = spec()
    algorithm: AlgorithmConfig = spec()
    trainer: TrainerConfig = spec()
    ray_kwargs: RayKwargsConfig = spec()
