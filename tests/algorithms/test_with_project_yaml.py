"""Every registered algorithm runs off the project yaml's own keys and defaults, as the typed
sections a run hands over (catches key-name drift between megarl/configs/ and megarl.algorithms)."""

import dataclasses

import numpy as np
import torch

import megarl.algorithms as A
from algo_config import actor, algorithm, project


def _batch(B=4, R=5):
    torch.manual_seed(0)
    mask = (torch.arange(R)[None] < torch.tensor([[5], [3], [4], [2]])).float()
    old = -torch.rand(B, R) * 2
    return old, old + 0.05 * torch.randn(B, R), torch.randn(B, 1).expand(B, R).clone(), mask


def test_every_policy_loss_runs_on_the_yaml_actor_config():
    old, new, adv, mask = _batch()
    cfg = actor(policy_loss={"dro_beta": 0.1})  # dro's one required key; the losses never read loss_mode
    for mode in sorted(n for n in A.POLICY_LOSSES if not n.startswith("_")):
        # bypass_mode also reads algorithm.rollout_correction (the actor worker binds it)
        extra = {"rollout_correction": algorithm().rollout_correction} if mode == "bypass_mode" else {}
        logp = new.clone().requires_grad_(True)
        loss, metrics = A.get_policy_loss(mode)(old, logp, adv, mask, cfg.loss_agg_mode, cfg, **extra)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(logp.grad).all(), mode
        assert {"actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"} <= set(metrics), mode


def test_kl_pieces_and_rollout_correction_on_yaml_defaults():
    cfg = project()
    ctrl = A.get_kl_controller(cfg.algorithm.kl_ctrl)
    assert ctrl.value == cfg.algorithm.kl_ctrl.kl_coef
    old, new, _, mask = _batch()
    A.kl_penalty(new, old, cfg.algorithm.kl_penalty)
    a = cfg.actor_rollout_ref.actor
    A.compute_kl_loss(new, old, mask, a.kl_loss_type, a.loss_agg_mode, None, a.loss_scale_factor)
    rc = algorithm(rollout_correction={"rollout_is": "token", "rollout_rs": "geometric"}).rollout_correction
    w, m2, metrics = A.compute_rollout_correction(old, new, mask, rc)
    assert w is not None and "rollout_corr/rollout_rs_masked_fraction" in metrics


def test_every_estimator_runs_through_compute_advantage():
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
    base = algorithm(gdpo_reward_keys=["acc"])
    for name in sorted(A.ADV_ESTIMATORS):
        adv, ret = A.compute_advantage(data, dataclasses.replace(base, adv_estimator=name))
        assert adv.shape == (B, R) and torch.isfinite(adv).all() and torch.isfinite(ret).all(), name
