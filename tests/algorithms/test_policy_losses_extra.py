import math

import pytest
import torch

from algo_config import actor, rollout_correction
from megarl.algorithms import GlobalDenominator, get_policy_loss

CLIP = {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2}
CFG = actor(**CLIP, clip_ratio_c=1e9)


def tensors(old, new, adv, mask=None, dtype=torch.float64):
    old = torch.tensor(old, dtype=dtype)
    logp = torch.tensor(new, dtype=dtype, requires_grad=True)
    adv = torch.tensor(adv, dtype=dtype)
    mask = torch.ones_like(old) if mask is None else torch.tensor(mask, dtype=dtype)
    return old, logp, adv, mask


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_gspo_equals_vanilla_when_ratio_is_constant_per_sequence(mode):
    torch.manual_seed(0)
    old = torch.randn(4, 6, dtype=torch.float64) - 2
    per_seq_log_ratio = torch.tensor([[0.1], [-0.5], [0.3], [0.0]], dtype=torch.float64)
    new = (old + per_seq_log_ratio).requires_grad_(True)
    adv = torch.randn(4, 1, dtype=torch.float64).expand(4, 6)
    mask = (torch.arange(6)[None] < torch.tensor([[6], [2], [4], [5]])).double()
    g_loss, g_m = get_policy_loss("gspo")(old, new, adv, mask, mode, CFG)
    (g_grad,) = torch.autograd.grad(g_loss, new)
    v_loss, v_m = get_policy_loss("vanilla")(old, new, adv, mask, mode, CFG)
    (v_grad,) = torch.autograd.grad(v_loss, new)
    assert g_loss.item() == pytest.approx(v_loss.item(), rel=1e-10)
    assert torch.allclose(g_grad, v_grad)
    assert g_m["actor/pg_clipfrac"] == pytest.approx(v_m["actor/pg_clipfrac"])


def test_gspo_uses_sequence_ratio_by_hand():
    # token log ratios 0.4 and 0.0 -> sequence ratio exp(0.2) = 1.2214 > 1.2: clipped for A > 0
    old, logp, adv, mask = tensors([[0.0, 0.0]], [[0.4, 0.0]], [[1.0, 1.0]])
    loss, m = get_policy_loss("gspo")(old - 1, logp - 1, adv, mask, "token-mean", CFG)
    assert loss.item() == pytest.approx(-1.2)
    assert m["actor/pg_clipfrac"] == 1.0


def test_sapo_by_hand_and_on_policy_gradient():
    cfg = actor(tau_pos=1.0, tau_neg=2.0)
    old, logp, adv, mask = tensors([[0.0, 0.0]], [[math.log(1.5), 0.0]], [[1.0, -1.0]])
    loss, _ = get_policy_loss("sapo")(old - 1, logp - 1, adv, mask, "token-sum", cfg)
    g_pos = 4.0 / 1.0 / (1 + math.exp(-0.5))  # tau=1, r=1.5
    g_neg = 4.0 / 2.0 * 0.5  # tau=2, r=1
    assert loss.item() == pytest.approx(-g_pos + g_neg)
    # on-policy (r = 1) the gradient w.r.t. log pi is -A, like the plain policy gradient
    old, logp, adv, mask = tensors([[-1.0, -2.0]], [[-1.0, -2.0]], [[0.7, -1.3]])
    loss, _ = get_policy_loss("sapo")(old, logp, adv, mask, "token-sum", cfg)
    loss.backward()
    assert torch.allclose(logp.grad, -adv)


def test_cispo_by_hand_keeps_gradient_of_clipped_tokens():
    cfg = actor(clip_ratio_low=0.2, clip_ratio_high=0.2)
    old = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    logp = torch.tensor([[-1.0 + math.log(2.0), -1.0]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, -2.0]], dtype=torch.float64)
    loss, m = get_policy_loss("cispo")(old, logp, adv, torch.ones(1, 2), "token-sum", cfg)
    lp0 = -1.0 + math.log(2.0)
    assert loss.item() == pytest.approx(-1.2 * 1.0 * lp0 + 1.0 * 2.0 * -1.0)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1.2, 2.0]], dtype=torch.float64))
    assert m["actor/pg_clipfrac"] == 0.5


def test_geo_mean_by_hand():
    cfg = actor(clip_ratio_low=0.4, clip_ratio_high=0.4)
    # seq 0, A=+1: log ratios 0.6 (clipped to 0.4, helps objective) and -0.2 -> mean 0.1
    # seq 1, A=-1: log ratios -0.6 (clipped to -0.4) and 0.2 -> mean -0.1, 1 valid token of 2 masked? no
    old = torch.zeros(2, 3, dtype=torch.float64) - 1
    new = old + torch.tensor([[0.6, -0.2, 9.0], [-0.6, 0.2, 9.0]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, 5.0], [-1.0, -1.0, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.float64)
    loss, m = get_policy_loss("geo_mean")(old, new, adv, mask, "token-mean", cfg)
    expect = (-1.0 * math.exp(0.1) + 1.0 * math.exp(-0.1)) / 2
    assert loss.item() == pytest.approx(expect)
    assert m["actor/pg_clipfrac"] == pytest.approx(1 / 4) and m["actor/pg_clipfrac_lower"] == pytest.approx(1 / 4)
    # micro-batch invariance with GlobalDenominator
    denom = GlobalDenominator.from_mask(mask)
    parts = sum(
        get_policy_loss("geo_mean")(old[i : i + 1], new[i : i + 1], adv[i : i + 1], mask[i : i + 1], "token-mean", cfg, denom)[0]
        for i in range(2)
    )
    assert parts.item() == pytest.approx(expect)
    with pytest.raises(ValueError, match="GlobalDenominator"):
        get_policy_loss("geo_mean")(old, new, adv, mask, "token-mean", cfg, 4)


def test_dppo_tv_by_hand():
    cfg = actor(clip_ratio_low=0.1, clip_ratio_high=0.1, clip_ratio_c=20.0)
    p_old = torch.tensor([[0.5, 0.5, 0.5, 0.5]], dtype=torch.float64)
    p_new = torch.tensor([[0.55, 0.7, 0.3, 0.45]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    logp = p_new.log().requires_grad_(True)
    loss, m = get_policy_loss("dppo_tv")(p_old.log(), logp, adv, torch.ones(1, 4), "token-sum", cfg)
    # kept: tok0 (+0.05 <= 0.1), tok3 (-0.05 >= -0.1); dropped: tok1 (+0.2), tok2 (-0.2)
    r = p_new / p_old
    expect = -(1.0 * r[0, 0] * math.log(0.55)) + (1.0 * r[0, 3] * math.log(0.45))
    assert loss.item() == pytest.approx(expect.item())
    assert m["actor/pg_clipfrac"] == 0.5
    loss.backward()
    assert logp.grad[0, 1] == 0 and logp.grad[0, 2] == 0
    assert logp.grad[0, 0].item() == pytest.approx(-r[0, 0].item())  # ratio is detached


def test_dppo_kl_by_hand():
    cfg = actor(clip_ratio_low=0.05, clip_ratio_high=0.05, clip_ratio_c=20.0)
    p_old = torch.tensor([[0.5, 0.5, 0.5]], dtype=torch.float64)
    p_new = torch.tensor([[0.8, 0.52, 0.2]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, 1.0]], dtype=torch.float64)
    # binary KL(0.5 || 0.8) = 0.5 ln(0.5/0.8) + 0.5 ln(0.5/0.2) = 0.2231 > 0.05 -> dropped (moved up with A>0)
    # KL(0.5 || 0.52) ~ 8e-4 -> kept; p=0.2 moved down with A>0 -> kept regardless of KL
    _, m = get_policy_loss("dppo_kl")(p_old.log(), p_new.log(), adv, torch.ones(1, 3), "token-sum", cfg)
    assert m["actor/pg_clipfrac"] == pytest.approx(1 / 3)


def test_dro_by_hand_and_requires_beta():
    old, logp, adv, mask = tensors([[-1.0, -1.0]], [[-0.5, -2.0]], [[1.0, -1.0]])
    loss, _ = get_policy_loss("dro")(old, logp, adv, mask, "token-sum", actor(policy_loss={"dro_beta": 2.0}))
    expect = -(1.0 * -0.5 - 1.0 * 0.25) - (-1.0 * -2.0 - 1.0 * 1.0)
    assert loss.item() == pytest.approx(expect)
    with pytest.raises(ValueError, match="dro_beta"):
        get_policy_loss("dro")(old, logp, adv, mask, "token-sum", actor(policy_loss={"dro_beta": None}))


def test_clip_cov_cuts_gradient_of_selected_tokens():
    torch.manual_seed(0)
    cfg = actor(clip_ratio_low=10.0, clip_ratio_high=10.0,
                policy_loss={"clip_cov_ratio": 0.5, "clip_cov_lb": -1e9, "clip_cov_ub": 1e9})
    old = torch.zeros(1, 4, dtype=torch.float64) - 1
    logp = old.clone().requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0, 2.0, 0.5]], dtype=torch.float64)
    loss, m = get_policy_loss("clip_cov")(old, logp, adv, torch.ones(1, 4), "token-sum", cfg)
    loss.backward()
    assert m["actor/pg_clipfrac"] == 0.5  # int(0.5 * 4) = 2 tokens cut
    assert int((logp.grad == 0).sum()) == 2
    kept = logp.grad != 0
    assert torch.allclose(logp.grad[kept], -adv[kept])


def test_kl_cov_penalizes_top_covariance_token():
    cfg = actor(policy_loss={"kl_cov_ratio": 0.25, "ppo_kl_coef": 1.0})
    old = torch.tensor([[-1.0, -1.0, -1.0, -1.0]], dtype=torch.float64)
    new = torch.tensor([[-0.5, -1.0, -1.0, -1.5]], dtype=torch.float64)
    adv = torch.tensor([[2.0, 0.0, 0.0, -2.0]], dtype=torch.float64)
    # cov = (A - 0)(logp - (-1)) = [1, 0, 0, 1]; top-1 -> first max (token 0) gets + |0.5|
    loss, m = get_policy_loss("kl_cov")(old, new, adv, torch.ones(1, 4), "token-sum", cfg)
    expect = -2.0 * math.exp(0.5) + 0.5 + 2.0 * math.exp(-0.5)
    assert loss.item() == pytest.approx(expect)
    assert m["actor/pg_clipfrac"] == pytest.approx(1 / 4)


def test_bypass_mode_reinforce_uses_truncated_is_and_rejection():
    rc = rollout_correction(loss_type="reinforce", rollout_is="token", rollout_is_threshold=2.0,
                            rollout_is_batch_normalize=False, rollout_rs="token_k1", rollout_rs_threshold="0.2_5.0",
                            rollout_token_veto_threshold=None)
    rollout = torch.tensor([[-1.0, -1.0, -1.0]], dtype=torch.float64)
    logp = (rollout + torch.tensor([[math.log(3.0), math.log(0.5), math.log(10.0)]])).requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, 1.0]], dtype=torch.float64)
    loss, m = get_policy_loss("bypass_mode")(
        rollout, logp, adv, torch.ones(1, 3), "token-sum", actor(), rollout_correction=rc
    )
    # k1 = -log r: token 2 has r=10 -> -log 10 < log 0.2 -> rejected. Weights: min(3,2)=2, 0.5
    lp = logp.detach()[0]
    assert loss.item() == pytest.approx(-(2.0 * lp[0] + 0.5 * lp[1]).item())
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1 / 3)
    with pytest.raises(TypeError, match="rollout_correction"):
        get_policy_loss("bypass_mode")(rollout, logp, adv, torch.ones(1, 3), "token-sum", actor())


def test_bypass_mode_ppo_clip_is_vanilla_on_the_rejection_mask():
    rc = rollout_correction(loss_type="ppo_clip", rollout_is=None, rollout_rs="token", rollout_rs_threshold=2.0,
                            rollout_rs_threshold_lower=None, rollout_token_veto_threshold=None)
    # ratios pi / pi_rollout: 1.5 (kept, clipped at 1.2 for A > 0), 0.9 (kept), 3.0 (rejected: > 2)
    rollout = torch.tensor([[-1.0, -1.0, -1.0]], dtype=torch.float64)
    logp = rollout + torch.tensor([[math.log(1.5), math.log(0.9), math.log(3.0)]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, 1.0]], dtype=torch.float64)
    loss, m = get_policy_loss("bypass_mode")(rollout, logp, adv, torch.ones(1, 3), "token-sum", CFG,
                                             rollout_correction=rc)
    assert loss.item() == pytest.approx(-(1.2 + 0.9))
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("name", ["gspo", "sapo", "cispo", "geo_mean", "dppo_tv", "dppo_kl", "dro", "clip_cov", "kl_cov", "gpg", "vanilla"])
def test_masked_entries_never_leak(name):
    torch.manual_seed(5)
    cfg = actor(**CLIP, clip_ratio_c=3.0, policy_loss={"dro_beta": 0.1, "clip_cov_ratio": 0.5})
    old = torch.randn(3, 5) - 2
    new = old + 0.1 * torch.randn(3, 5)
    adv = torch.randn(3, 1).expand(3, 5).clone()
    mask = (torch.arange(5)[None] < torch.tensor([[5], [3], [1]])).float()
    torch.manual_seed(1)
    a, ma = get_policy_loss(name)(old, new, adv, mask, "token-mean", cfg)
    old2, new2, adv2 = old.clone(), new.clone(), adv.clone()
    old2[mask == 0], new2[mask == 0], adv2[mask == 0] = -50.0, 3.0, 1e4
    torch.manual_seed(1)
    b, mb = get_policy_loss(name)(old2, new2, adv2, mask, "token-mean", cfg)
    assert b.item() == pytest.approx(a.item(), rel=1e-5, abs=1e-7)
    assert ma["actor/pg_clipfrac"] == pytest.approx(mb["actor/pg_clipfrac"])


@pytest.mark.parametrize("name", ["vanilla", "gpg", "gspo", "sapo", "cispo", "geo_mean", "dppo_tv", "dppo_kl", "dro"])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_policy_loss_gradient_is_micro_batch_split_invariant(name, mode):
    # clip_cov / kl_cov are excluded: they pick tokens by micro-batch statistics (as in verl).
    torch.manual_seed(7)
    cfg = actor(**CLIP, clip_ratio_c=3.0, policy_loss={"dro_beta": 0.1})
    old = torch.randn(6, 5, dtype=torch.float64) - 2
    new = (old + 0.2 * torch.randn(6, 5, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(6, 1, dtype=torch.float64).expand(6, 5)
    mask = (torch.arange(5)[None] < torch.tensor([[5], [2], [4], [1], [3], [5]])).double()
    whole, _ = get_policy_loss(name)(old, new, adv, mask, mode, cfg)
    (g_whole,) = torch.autograd.grad(whole, new)
    denom = GlobalDenominator.from_mask(mask)
    parts = [slice(0, 1), slice(1, 4), slice(4, 6)]
    total = sum(get_policy_loss(name)(old[p], new[p], adv[p], mask[p], mode, cfg, denom)[0] for p in parts)
    (g_split,) = torch.autograd.grad(total, new)
    assert total.item() == pytest.approx(whole.item(), rel=1e-9)
    assert torch.allclose(g_split, g_whole)
