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


def test_bad_role_and_optim_keys(cfg):
    with pytest.raises(ValueError, match="role"):
        ActorWorker(cfg.actor_rollout_ref, "critic")
    from megarl.workers.megatron.optim import build_scheduler

    optim = OmegaConf.to_container(cfg.actor_rollout_ref.actor.optim)
    optim.update(lr_decay_style="cosine", total_training_steps=-1)
    with pytest.raises(ValueError, match="actor_rollout_ref.actor.optim.lr_decay_style='cosine' needs"):
        build_scheduler(None, optim, prefix="actor_rollout_ref.actor.optim")
    optim.update(lr_decay_style="wsd")
    with pytest.raises(ValueError, match="lr_decay_style='wsd' is not supported"):
        build_scheduler(None, optim, prefix="actor_rollout_ref.actor.optim")


def test_lr_schedule_warmup_then_linear_decay():
    """Hand-derived: warmup 2 steps to lr=1, then linear decay to min_lr_ratio*lr at step 6."""
    import torch

    from megarl.workers.megatron.optim import build_scheduler

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    optim = {"lr": 1.0, "lr_warmup_steps": 2, "lr_decay_style": "linear", "min_lr_ratio": 0.2,
             "weight_decay": 0.0, "total_training_steps": 6, "use_checkpoint_opt_param_scheduler": False}
    scheduler = build_scheduler(optimizer, optim, prefix="critic.optim")
    lrs = []
    for _ in range(7):
        lrs.append(optimizer.param_groups[0]["lr"])
        scheduler.step(increment=1)
    # steps 0..2 warmup 0, .5, 1; then decay over steps 2..6: 1 - 0.8 * (s - 2) / 4
    assert lrs == pytest.approx([0.0, 0.5, 1.0, 0.8, 0.6, 0.4, 0.2])
