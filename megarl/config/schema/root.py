"""The typed config tree: the keys megarl implements (defaults live in the yaml; the verl keys
megarl accepts without implementing are in verl_compat.accepted_keys)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from megarl.config.schema.actor import ActorRolloutRefConfig
from megarl.config.schema.algorithm import AlgorithmConfig
from megarl.config.schema.critic import CriticConfig
from megarl.config.schema.data import DataConfig
from megarl.config.schema.distillation import DistillationConfig
from megarl.config.schema.reward import LegacyCustomRewardFunctionConfig, LegacyRewardModelConfig, RewardConfig
from megarl.config.schema.field import Section, spec
from megarl.config.schema.trainer import RayKwargsConfig, TrainerConfig


def critic_on(enable: bool | None, adv_estimator: str) -> bool:
    """critic.enable, where null means: on exactly for GAE (verl's rule)."""
    return adv_estimator == "gae" if enable is None else bool(enable)


def reference_on(use_kl_loss: bool, use_kl_in_reward: bool) -> bool:
    """The reference model runs when a KL term (actor loss or in-reward penalty) needs it."""
    return bool(use_kl_loss or use_kl_in_reward)


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
    distillation: DistillationConfig = spec()

    def trains_critic(self) -> bool:
        """Whether the run builds and trains the critic (critic.enable; null = exactly for GAE)."""
        return critic_on(self.critic.enable, self.algorithm.adv_estimator)

    def runs_reference(self) -> bool:
        """Whether the run computes reference log-probs (KL loss or KL in reward)."""
        return reference_on(self.actor_rollout_ref.actor.use_kl_loss, self.algorithm.use_kl_in_reward)
