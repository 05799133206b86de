"""Every registered algorithm runs off the project yaml's own keys and defaults
(catches key-name drift between configs/ and megarl.algorithms)."""

from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import megarl.algorithms as A

YAML = Path(__file__).resolve().parents[2] / "configs" / "megatron" / "ppo_megatron_trainer.yaml"
pytestmark = pytest.mark.skipif(not YAML.exists(), reason="project yaml not present")


@pytest.fixture(scope="module")
def cfg():
    return OmegaConf.load(YAML)


def _batch(B=4, R=5):
    torch.manual_seed(0)
    mask = (torch.arange(R)[None] < torch.tensor([[5], [3], [4], [2]])).float()
    old = -torch.rand(B, R) * 2
    return old, old + 0.05 * torch.randn(B, R), torch.randn(B, 1).expand(B, R).clone(), mask


def test_every_policy_loss_runs_on_the_yaml_actor_config(cfg):
    actor = OmegaConf.create(OmegaConf.to_container(cfg.actor_rollout_ref.actor, resolve=False))
    old, new, adv, mask = _batch()
    for mode in sorted(n for n in A.POLICY_LOSSES if not n.startswith("_")):
        actor.policy_loss.loss_mode = mode
        if mode == "dro":
            OmegaConf.update(actor, "policy_loss.dro_beta", 0.1, force_add=True)
        if mode == "bypass_mode":
            OmegaConf.update(actor, "policy_loss.rollout_correction", cfg.algorithm.rollout_correction, force_add=True)
        logp = new.clone().requires_grad_(True)
        loss, metrics = A.get_policy_loss(mode)(old, logp, adv, mask, actor.loss_agg_mode, actor)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(logp.grad).all(), mode
        assert {"actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"} <= set(metrics), mode


def test_kl_pieces_and_rollout_correction_on_yaml_defaults(cfg):
    ctrl = A.get_kl_controller(cfg.algorithm.kl_ctrl)
    assert ctrl.value == cfg.algorithm.kl_ctrl.kl_coef
    old, new, _, mask = _batch()
    A.kl_penalty(new, old, cfg.algorithm.kl_penalty)
    A.compute_kl_loss(new, old, mask, cfg.actor_rollout_ref.actor.kl_loss_type)
    rc = OmegaConf.merge(cfg.algorithm.rollout_correction, {"rollout_is": "token", "rollout_rs": "geometric"})
    w, m2, metrics = A.compute_rollout_correction(old, new, mask, rc)
    assert w is not None and "rollout_corr/rollout_rs_masked_fraction" in metrics


def test_every_estimator_runs_through_compute_advantage(cfg):
    B, R = 6, 4
    mask = torch.ones(B, R)
    data = {
        "token_level_rewards": torch.randn(B, R),
        "response_mask": mask,
        "uid": np.array(["a", "a", "a", "b", "b", "b"], dtype=object),
        "values": torch.randn(B, R),
        "reward_baselines": torch.randn(B),
        "old_log_probs": -torch.rand(B, R),
        "sum_pi_squared": torch.rand(B, R),
        "acc": np.array([1.0, 0.0, 1.0, 0.0, 0.0, 1.0]),
    }
    for name in sorted(A.ADV_ESTIMATORS):
        algo = OmegaConf.merge(cfg.algorithm, {"adv_estimator": name, "gdpo_reward_keys": ["acc"]})
        adv, ret = A.compute_advantage(data, algo)
        assert adv.shape == (B, R) and torch.isfinite(adv).all() and torch.isfinite(ret).all(), name
