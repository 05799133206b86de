"""Which Megatron models a config builds, and the keys of each one's layout and batches."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from megarl.config.rules.view import View
from megarl.config.schema.root import critic_on, reference_on
from megarl.parallel.layout import MEGATRON_KEYS, ParallelLayout


@dataclass(frozen=True)
class Role:
    """A Megatron model of the run: `megatron` = its layout section, `model_path` = its HF dir key."""

    name: str
    megatron: str
    model_path: str
    override_config: str | None


ACTOR = Role("actor", "actor_rollout_ref.actor.megatron", "actor_rollout_ref.model.path", "actor_rollout_ref.model.override_config")
REF = Role("ref", "actor_rollout_ref.ref.megatron", "actor_rollout_ref.model.path", "actor_rollout_ref.model.override_config")
CRITIC = Role("critic", "critic.megatron", "critic.model.path", "critic.model.override_config")
# the learned reward model (reward.reward_model): its layout is verl's rollout.* keys, no override_config
RM_ROLE = Role("reward_model", "reward.reward_model.rollout", "reward.reward_model.model_path", None)
# the distillation teacher: its layout is verl's teacher inference.* keys
TEACHER_ROLE = Role("teacher", "distillation.teacher_models.teacher_model.inference",
                    "distillation.teacher_models.teacher_model.model_path", None)


def critic_enabled(v: View) -> bool:
    return critic_on(v.get("critic.enable"), v.get("algorithm.adv_estimator"))


def ref_enabled(v: View) -> bool:
    return reference_on(v.get("actor_rollout_ref.actor.use_kl_loss"), v.get("algorithm.use_kl_in_reward"))


def need_critic(cfg: DictConfig) -> bool:
    """Whether the run trains a critic (critic.enable, null = exactly for GAE). For the trainer."""
    return critic_enabled(View(cfg, set()))


def need_reference(cfg: DictConfig) -> bool:
    """Whether the run computes reference log-probs (KL loss or KL in reward). For the trainer."""
    return ref_enabled(View(cfg, set()))


def active_roles(v: View) -> list[Role]:
    roles = [ACTOR]
    if ref_enabled(v):
        roles.append(REF)
    if critic_enabled(v):
        roles.append(CRITIC)
    return roles


def role_layout(v: View, role: Role) -> ParallelLayout:
    """The role's megatron layout over the world of trainer.nnodes x trainer.n_gpus_per_node ranks."""
    sizes = {size: v.get(f"{role.megatron}.{key}") for size, key in MEGATRON_KEYS.items()}
    return ParallelLayout(world_size=v.world_size(), **sizes)
