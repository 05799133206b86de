"""Workers read the shipped yaml's keys (verl names) without starting a model."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from megarl.workers.actor import ActorWorker
from megarl.workers.critic import CriticWorker

YAML = Path(__file__).resolve().parents[2] / "configs" / "megatron" / "ppo_megatron_trainer.yaml"


@pytest.fixture()
def cfg():
    cfg = OmegaConf.load(YAML)
    OmegaConf.resolve(cfg)
    return cfg


def test_actor_ref_critic_from_yaml(cfg):
    actor = ActorWorker(cfg.actor_rollout_ref, "actor", device="cpu")
    assert actor.train_spec.micro_batch_size == cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu
    assert actor.log_prob_spec.micro_batch_size == cfg.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu
    ref = ActorWorker(cfg.actor_rollout_ref, "ref", device="cpu")
    assert ref.log_prob_spec.micro_batch_size == cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu
    assert not ref.engine.trainable and actor.engine.trainable
    critic = CriticWorker(cfg.critic, device="cpu")
    assert critic.engine.value_head and critic.engine.trainable and critic.rollout_n == 1
    n = cfg.actor_rollout_ref.rollout.n
    assert n > 1  # the check below must see a value other than the default 1
    assert CriticWorker(cfg.critic, device="cpu", rollout_n=n).rollout_n == n


def test_bad_role(cfg):
    with pytest.raises(ValueError, match="role"):
        ActorWorker(cfg.actor_rollout_ref, "critic")
