"""Workers read the shipped yaml's keys (verl names) without starting a model."""

import pytest
import torch
from omegaconf import OmegaConf

from megarl.config import load_config, resolve_config
from megarl.protocol import DataProto
from megarl.workers.actor import ActorWorker
from megarl.workers.critic import CriticWorker


def _cfg(*overrides: str):
    return resolve_config(load_config(list(overrides)))


@pytest.fixture(scope="module")
def cfg():
    return _cfg()


def test_actor_ref_critic_from_yaml(cfg):
    actor = ActorWorker(cfg.actor_rollout_ref, "actor", device="cpu")
    assert actor.train_spec.micro_batch_size == cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu
    assert actor.log_prob_spec.micro_batch_size == cfg.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu
    ref = ActorWorker(cfg.actor_rollout_ref, "ref", device="cpu")
    assert ref.log_prob_spec.micro_batch_size == cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu
    assert not ref.engine.trainable and actor.engine.trainable
    critic = CriticWorker(cfg.critic, device="cpu")
    assert critic.engine.value_head and critic.engine.trainable
    # the value forward uses the training micro-batch size (verl: no forward_micro_batch_size_per_gpu)
    assert critic.forward_spec.micro_batch_size == cfg.critic.ppo_micro_batch_size_per_gpu


def _update_batch(rows: int = 4, response_len: int = 3) -> DataProto:
    ones = torch.ones(rows, response_len)
    return DataProto.from_dict({
        "input_ids": torch.ones(rows, 5, dtype=torch.long), "attention_mask": torch.ones(rows, 5, dtype=torch.long),
        "position_ids": torch.arange(5).repeat(rows, 1), "responses": torch.ones(rows, response_len, dtype=torch.long),
        "response_mask": ones, "values": ones, "returns": ones, "old_log_probs": ones, "advantages": ones,
    }, meta_info={"nan_policy": "stop"})


@pytest.mark.parametrize("n", [1, 3])
def test_mini_batch_unit_is_rollout_n(monkeypatch, n):
    """actor: actor_rollout_ref.rollout.n; critic: critic.rollout_n, which the yaml ties to it."""
    import megarl.workers.actor as actor_module
    import megarl.workers.critic as critic_module

    cfg = _cfg(f"actor_rollout_ref.rollout.n={n}", "actor_rollout_ref.actor.use_kl_loss=false")
    assert cfg.critic.rollout_n == n
    seen = {}
    for module, name in ((actor_module, "actor"), (critic_module, "critic")):
        monkeypatch.setattr(module, "run_ppo_update", lambda *a, _name=name, **kw: seen.update({_name: kw}) or {})
    ActorWorker(cfg.actor_rollout_ref, "actor", device="cpu").update_policy(_update_batch())
    CriticWorker(cfg.critic, device="cpu").update_critic(_update_batch())
    assert seen["actor"]["rollout_n"] == n and seen["critic"]["rollout_n"] == n
    assert seen["critic"]["seed"] == cfg.actor_rollout_ref.actor.data_loader_seed  # critic.data_loader_seed follows


def test_bypass_mode_loss_needs_the_rollout_correction_section(monkeypatch):
    """loss_mode=bypass_mode reads algorithm.rollout_correction, which the worker gets as an argument."""
    import megarl.workers.actor as actor_module
    from megarl.config.read import typed_config

    cfg = _cfg("actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode", "actor_rollout_ref.actor.use_kl_loss=false",
               "algorithm.rollout_correction.bypass_mode=true")
    with pytest.raises(ValueError, match="bypass_mode reads algorithm.rollout_correction"):
        ActorWorker(cfg.actor_rollout_ref, "actor", device="cpu").update_policy(_update_batch())
    seen = {}
    monkeypatch.setattr(actor_module, "run_ppo_update", lambda *a, **kw: seen.update(kw) or {})
    rc = typed_config(cfg).algorithm.rollout_correction
    ActorWorker(cfg.actor_rollout_ref, "actor", device="cpu", rollout_correction=rc).update_policy(_update_batch())
    assert seen, "update_policy did not reach the PPO loop"


def test_bad_role(cfg):
    with pytest.raises(ValueError, match="role"):
        ActorWorker(cfg.actor_rollout_ref, "critic")
    # optimizer / schedule keys: tests/workers/test_optim.py


