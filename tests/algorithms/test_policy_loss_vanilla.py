import math

import pytest
import torch

from algo_config import actor
from megarl.algorithms import POLICY_LOSSES, get_policy_loss

CLIP = {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28}
CFG = actor(**CLIP, clip_ratio_c=3.0)


def run(ratios, advs, mask=None, cfg=CFG, mode="token-mean"):
    ratio = torch.tensor([ratios], dtype=torch.float64)
    old = torch.zeros_like(ratio)
    logp = torch.log(ratio).requires_grad_(True)
    adv = torch.tensor([advs], dtype=torch.float64)
    mask = torch.ones_like(ratio) if mask is None else torch.tensor([mask])
    loss, metrics = get_policy_loss("vanilla")(old, logp, adv, mask, mode, cfg)
    return loss, metrics, logp


def test_vanilla_hand_values():
    # token 1: A=+1, r=1.5 -> clipped at 1.28 -> loss -1.28
    # token 2: A=+1, r=0.5 -> min(r, clip)=0.5 (no clip from below for A>0) -> -0.5
    # token 3: A=-1, r=0.5 -> max(0.5, 0.8) -> loss 0.8 (clipped)
    # token 4: A=-1, r=5.0 -> max(5, 1.28)=5, dual-clip caps at 3 -> loss 3
    loss, m, _ = run([1.5, 0.5, 0.5, 5.0], [1.0, 1.0, -1.0, -1.0])
    assert loss.item() == pytest.approx((-1.28 - 0.5 + 0.8 + 3.0) / 4)
    assert m["actor/pg_clipfrac"] == pytest.approx(2 / 4)
    assert m["actor/pg_clipfrac_lower"] == pytest.approx(1 / 4)
    ppo_kl = -(math.log(1.5) + 2 * math.log(0.5) + math.log(5.0)) / 4
    assert m["actor/ppo_kl"] == pytest.approx(ppo_kl)


def test_vanilla_gradient_zero_where_clipped():
    loss, _, logp = run([1.5, 1.1, 0.5], [1.0, 1.0, -1.0])
    loss.backward()
    # d/dlogp of -A r / 3 = -A r / 3 where unclipped; 0 where clipped
    assert torch.allclose(logp.grad, torch.tensor([[0.0, -1.1 / 3, 0.0]], dtype=torch.float64))


def test_dual_clip_bounds_loss_for_negative_advantages():
    torch.manual_seed(0)
    ratios = torch.exp(torch.randn(200) * 3).tolist()
    advs = (-torch.rand(200) * 2).tolist()
    loss_tok, _, _ = run(ratios, advs, mode="token-sum")
    bound = sum(-a * 3.0 for a in advs)
    assert loss_tok.item() <= bound + 1e-9
    no_dual, _, _ = run(ratios, advs, mode="token-sum", cfg=actor(**CLIP, clip_ratio_c=1e9))
    assert no_dual.item() > bound  # the cap is active on this data


def test_clip_ratio_c_must_exceed_one():
    with pytest.raises(ValueError, match="clip_ratio_c"):
        run([1.0], [1.0], cfg=actor(**CLIP, clip_ratio_c=1.0))


def test_clip_ratio_low_high_default_to_clip_ratio():
    loss, _, _ = run([1.5], [1.0], cfg=actor(clip_ratio=0.1, clip_ratio_low=None, clip_ratio_high=None))
    assert loss.item() == pytest.approx(-1.1)


def test_masked_tokens_do_not_leak_and_is_weights_multiply():
    old = torch.tensor([[0.0, 0.0, 0.0]])
    logp = torch.tensor([[0.1, -0.2, 0.0]])
    adv = torch.tensor([[1.0, -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    base, m1 = get_policy_loss("vanilla")(old, logp, adv, mask, "token-mean", CFG)
    logp2, adv2, old2 = logp.clone(), adv.clone(), old.clone()
    logp2[0, 2], adv2[0, 2], old2[0, 2] = float("nan"), 1e9, -50.0
    again, m2 = get_policy_loss("vanilla")(old2, logp2, adv2, mask, "token-mean", CFG)
    assert again.item() == pytest.approx(base.item()) and m1 == m2
    w = torch.tensor([[2.0, 0.5, 7.0]])
    weighted, _ = get_policy_loss("vanilla")(old, logp, adv, mask, "token-mean", CFG, rollout_is_weights=w)
    r0, r1 = math.exp(0.1), math.exp(-0.2)
    assert weighted.item() == pytest.approx((2.0 * -r0 + 0.5 * max(r1, 0.8)) / 2, rel=1e-6)


def test_gpg_loss_is_plain_pg():
    logp = torch.tensor([[-1.0, -2.0]])
    adv = torch.tensor([[2.0, -1.0]])
    loss, _ = get_policy_loss("gpg")(torch.zeros(1, 2), logp, adv, torch.ones(1, 2), "token-sum", actor())
    assert loss.item() == pytest.approx(2.0 * 1.0 + -1.0 * 2.0)


def test_unknown_policy_loss_lists_valid():
    with pytest.raises(ValueError, match="loss_mode") as e:
        get_policy_loss("ppo")
    assert "'vanilla'" in str(e.value)
    assert "vanilla" in POLICY_LOSSES
