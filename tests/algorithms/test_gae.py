import pytest
import torch

from megarl.algorithms import gae_advantages_returns, get_adv_estimator, masked_whiten
from megarl.algorithms.gae import discounted_returns, reverse_discounted_cumsum


def loop_gae(rewards, values, mask, gamma, lam):
    """Independent token-by-token reference: skip masked tokens, carry state across them."""
    B, T = rewards.shape
    adv = torch.zeros(B, T)
    for b in range(B):
        next_value, last = 0.0, 0.0
        for t in reversed(range(T)):
            if mask[b, t]:
                delta = rewards[b, t].item() + gamma * next_value - values[b, t].item()
                last = delta + gamma * lam * last
                next_value = values[b, t].item()
                adv[b, t] = last
    return adv, (adv + values) * mask


def test_hand_computed_two_step():
    # r = [0, 1], V = [0.5, 0.2], gamma = 0.9, lam = 0.8
    # delta_1 = 1 - 0.2 = 0.8; delta_0 = 0 + 0.9 * 0.2 - 0.5 = -0.32
    # A_1 = 0.8; A_0 = -0.32 + 0.72 * 0.8 = 0.256
    adv, ret = gae_advantages_returns(
        torch.tensor([[0.0, 1.0, 5.0]]), torch.tensor([[0.5, 0.2, 3.0]]), torch.tensor([[1, 1, 0]]), 0.9, 0.8
    )
    assert torch.allclose(adv, torch.tensor([[0.256, 0.8, 0.0]]), atol=1e-6)
    assert torch.allclose(ret, torch.tensor([[0.756, 1.0, 0.0]]), atol=1e-6)


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.5, 0.0), (1.0, 0.9)])
def test_matches_loop_reference_with_ragged_and_interior_masks(gamma, lam):
    torch.manual_seed(1)
    B, T = 6, 37
    rewards, values = torch.randn(B, T), torch.randn(B, T)
    mask = (torch.rand(B, T) > 0.3).long()  # interior holes (multi-turn observation tokens)
    mask[0] = 0  # an all-masked row
    mask[1, 20:] = 0  # right padding
    adv, ret = gae_advantages_returns(rewards, values, mask, gamma, lam)
    ref_adv, ref_ret = loop_gae(rewards, values, mask, gamma, lam)
    assert torch.allclose(adv, ref_adv, atol=1e-5)
    assert torch.allclose(ret, ref_ret, atol=1e-5)


def test_gamma_lam_one_is_reward_to_go_minus_value():
    torch.manual_seed(2)
    rewards, values = torch.randn(3, 9), torch.randn(3, 9)
    mask = (torch.arange(9)[None] < torch.tensor([[9], [4], [1]])).long()
    adv, ret = gae_advantages_returns(rewards, values, mask, 1.0, 1.0)
    r2g = torch.flip(torch.cumsum(torch.flip(rewards * mask, [-1]), -1), [-1])
    assert torch.allclose(adv, (r2g - values) * mask, atol=1e-5)
    assert torch.allclose(ret, r2g * mask, atol=1e-5)


def test_masked_positions_never_leak():
    torch.manual_seed(3)
    rewards, values = torch.randn(4, 12), torch.randn(4, 12)
    mask = (torch.rand(4, 12) > 0.4).long()
    adv, ret = gae_advantages_returns(rewards, values, mask, 0.97, 0.9)
    r2, v2 = rewards.clone(), values.clone()
    r2[mask == 0] = 1e6
    v2[mask == 0] = float("nan")
    adv2, ret2 = gae_advantages_returns(r2, v2, mask, 0.97, 0.9)
    assert torch.equal(adv, adv2) and torch.equal(ret, ret2)


def test_registered_gae_whitens_raw_advantages():
    torch.manual_seed(4)
    rewards, values = torch.randn(4, 6), torch.randn(4, 6)
    mask = (torch.arange(6)[None] < torch.tensor([[6], [3], [5], [2]])).long()
    raw, _ = loop_gae(rewards, values, mask, 1.0, 0.95)
    valid = raw[mask.bool()]
    expect = (raw - valid.mean()) / torch.sqrt(valid.var(unbiased=True) + 1e-8) * mask
    adv, ret = get_adv_estimator("gae")(rewards, mask, values=values, gamma=1.0, lam=0.95)
    assert torch.allclose(adv, expect, atol=1e-5)
    assert torch.allclose(ret, (raw + values) * mask, atol=1e-5)
    with pytest.raises(ValueError, match="critic"):
        get_adv_estimator("gae")(rewards, mask, gamma=1.0, lam=0.95)


@pytest.mark.parametrize("T", [1, 3, 64, 65, 200])
@pytest.mark.parametrize("c", [0.0, 0.5, 0.99, 1.0])
def test_reverse_discounted_cumsum_against_loop(T, c):
    torch.manual_seed(T)
    x = torch.randn(3, T)
    expect = torch.zeros_like(x)
    acc = torch.zeros(3)
    for t in reversed(range(T)):
        acc = x[:, t] + c * acc
        expect[:, t] = acc
    assert torch.allclose(reverse_discounted_cumsum(x, c), expect, atol=1e-4)


def test_discounted_returns_skip_masked():
    g = discounted_returns(torch.tensor([[1.0, 7.0, 2.0, 4.0]]), torch.tensor([[1, 0, 1, 1]]), 0.5)
    # masked reward 7 is skipped; discount runs over valid tokens only
    assert torch.allclose(g, torch.tensor([[1 + 0.5 * (2 + 0.5 * 4), 0.0, 2 + 0.5 * 4, 4.0]]))
