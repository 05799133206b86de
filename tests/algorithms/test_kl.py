import math

import pytest
import torch

from algo_config import kl_ctrl
from megarl.algorithms import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    compute_kl_loss,
    get_kl_controller,
    kl_penalty,
)
from megarl.config.names import KL_PENALTIES

LOGP = torch.tensor([[-1.0, -2.0]])
REF = torch.tensor([[-1.5, -1.0]])


def test_estimators_by_hand():
    assert torch.allclose(kl_penalty(LOGP, REF, "kl"), torch.tensor([[0.5, -1.0]]))
    assert torch.allclose(kl_penalty(LOGP, REF, "k1"), torch.tensor([[0.5, -1.0]]))
    assert torch.allclose(kl_penalty(LOGP, REF, "abs"), torch.tensor([[0.5, 1.0]]))
    assert torch.allclose(kl_penalty(LOGP, REF, "mse"), torch.tensor([[0.125, 0.5]]))
    # k3: exp(ref - logp) - (ref - logp) - 1
    k3 = [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1]
    assert torch.allclose(kl_penalty(LOGP, REF, "low_var_kl"), torch.tensor([k3]))
    assert torch.allclose(kl_penalty(LOGP, REF, "k3"), torch.tensor([k3]))


def test_low_var_kl_is_clamped_to_10():
    out = kl_penalty(torch.tensor([[-30.0]]), torch.tensor([[-1.0]]), "low_var_kl")
    assert out.item() == 10.0


def test_full_kl_over_vocab():
    p = torch.tensor([0.5, 0.25, 0.25])
    q = torch.tensor([0.25, 0.5, 0.25])
    expected = 0.5 * math.log(2) + 0.25 * math.log(0.5)
    logits_p = torch.log(p).view(1, 1, 3) + 3.0  # logits, not normalized
    out = kl_penalty(logits_p, torch.log(q).view(1, 1, 3), "full")
    assert out.shape == (1, 1)
    assert out.item() == pytest.approx(expected, rel=1e-5)


def test_straight_through_plus_uses_k2_gradient_and_estimator_value():
    logp = LOGP.clone().requires_grad_(True)
    out = kl_penalty(logp, REF, "k3+")
    assert torch.allclose(out, kl_penalty(LOGP, REF, "k3"))
    out.sum().backward()
    assert torch.allclose(logp.grad, LOGP - REF)  # d/dx 0.5 (x - ref)^2


def test_unknown_kl_mode_lists_valid():
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_penalty(LOGP, REF, "k4")
    assert "k3+" in KL_PENALTIES and "full" in KL_PENALTIES


def test_adaptive_controller_update_by_hand():
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.5, horizon=100)
    ctrl.update(current_kl=0.55, n_steps=10)  # error 0.1 -> mult 1.01
    assert ctrl.value == pytest.approx(0.101)
    ctrl.update(current_kl=5.0, n_steps=10)  # error clipped to 0.2 -> mult 1.02
    assert ctrl.value == pytest.approx(0.101 * 1.02)
    fixed = FixedKLController(0.3)
    fixed.update(10.0, 5)
    assert fixed.value == 0.3


def test_get_kl_controller_from_config():
    fixed = get_kl_controller(kl_ctrl(type="fixed", kl_coef=0.2))
    assert isinstance(fixed, FixedKLController) and fixed.value == 0.2
    ctrl = get_kl_controller(kl_ctrl(type="adaptive", kl_coef=0.2, target_kl=0.1, horizon=10))
    assert isinstance(ctrl, AdaptiveKLController) and ctrl.value == 0.2
    assert (ctrl.target, ctrl.horizon) == (0.1, 10)
    with pytest.raises(ValueError, match="adaptive"):
        get_kl_controller(kl_ctrl(type="pid", kl_coef=0.2))
    with pytest.raises(ValueError, match="horizon"):
        get_kl_controller(kl_ctrl(type="adaptive", kl_coef=0.2, target_kl=0.1, horizon=0))


def test_apply_kl_penalty_in_reward():
    scores = torch.tensor([[0.0, 1.0, 7.0], [0.0, 0.0, 2.0]])
    old = torch.tensor([[-1.0, -1.0, 5.0], [-2.0, -1.0, 9.0]])
    ref = torch.tensor([[-1.5, -2.0, 0.0], [-1.0, -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    ctrl = AdaptiveKLController(0.1, target_kl=1.0, horizon=10)
    rewards, metrics = apply_kl_penalty(scores, old, ref, mask, ctrl, "kl")
    # kl = old - ref = [[0.5, 1, (masked)], [-1, 0, (masked)]]
    assert torch.allclose(rewards, torch.tensor([[-0.05, 0.9, 7.0], [0.1, 0.0, 2.0]]))
    # per-seq mean KL 0.75 and -0.5 -> batch mean 0.125
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(0.125)
    assert metrics["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1)
    # controller updated: error clip(0.125 - 1) = -0.2, n_steps = batch 2, horizon 10
    assert ctrl.value == pytest.approx(0.1 * (1 - 0.2 * 2 / 10))


def test_compute_kl_loss_token_mean():
    logp = torch.tensor([[-1.0, -2.0, 0.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, 5.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, metrics = compute_kl_loss(logp, ref, mask, "mse", "token-mean")
    assert loss.item() == pytest.approx((0.125 + 0.5) / 2)
    assert metrics["actor/kl_loss"] == pytest.approx(0.3125)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[0.25, -0.5, 0.0]]))
