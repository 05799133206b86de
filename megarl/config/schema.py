"""The whole config tree as dataclasses (types and constraints; defaults live in the yaml)."""

from __future__ import annotations

from dataclasses import dataclass

from megarl.config.schema_actor import ActorRolloutRefConfig
from megarl.config.schema_algorithm import AlgorithmConfig
from megarl.config.schema_critic import CriticConfig
from megarl.config.schema_data import DataConfig
from megarl.config.schema_reward import CustomRewardFunctionConfig, RewardConfig, RewardModelConfig
from megarl.config.schema_trainer import RayInitConfig, TrainerConfig
from megarl.config.spec import spec


@dataclass
class MegaRLConfig:
    """Root of `configs/megatron/ppo_megatron_trainer.yaml`."""

    data: DataConfig = spec()
    actor_rollout_ref: ActorRolloutRefConfig = spec()
    critic: CriticConfig = spec()
    reward_model: RewardModelConfig = spec()
    reward: RewardConfig = spec()
    custom_reward_function: CustomRewardFunctionConfig = spec()
    algorithm: AlgorithmConfig = spec()
    trainer: TrainerConfig = spec()
    ray_init: RayInitConfig = spec()
