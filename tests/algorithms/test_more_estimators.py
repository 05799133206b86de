import math

import numpy as np
import pytest
import torch

from algo_config import algorithm
from megarl.algorithms import compute_advantage, get_adv_estimator


def test_grpo_passk_by_hand():
    uid = np.array(["a", "a", "a", "b", "b"], dtype=object)
    rewards = torch.tensor([[1.0, 0.0], [3.0, 0.0], [2.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1], [1, 1]])
    adv, _ = get_adv_estimator("grpo_passk")(rewards, mask, index=uid, norm_adv_by_std_in_grpo=False)
    assert adv.tolist() == [[0, 0], [1.0, 0], [0, 0], [0, 0], [0, 0]]
    adv, _ = get_adv_estimator("grpo_passk")(rewards, mask, index=uid, norm_adv_by_std_in_grpo=True, epsilon=0.0)
    assert adv[1, 0].item() == pytest.approx(1.0 / 1.0)  # std of (1, 3, 2) = 1
    with pytest.raises(ValueError, match="rollout.n"):
        get_adv_estimator("grpo_passk")(rewards[:1], mask[:1], index=uid[:1], norm_adv_by_std_in_grpo=True)


def test_gdpo_normalizes_components_separately():
    uid = np.array(["a", "a", "b", "b"], dtype=object)
    mask = torch.ones(4, 2)
    acc = torch.tensor([1.0, 0.0, 1.0, 1.0])
    fmt = torch.tensor([10.0, 0.0, 0.0, 20.0])
    adv, _ = get_adv_estimator("gdpo")(
        torch.zeros(4, 2), mask, index=uid, norm_adv_by_std_in_grpo=True, reward_components={"acc": acc, "fmt": fmt},
        reward_weights=[1.0, 0.5],
    )
    # group-normalized (epsilon 1e-6; constant group b of acc gives 0): acc -> [0.7071, -0.7071, 0, 0]; fmt -> [0.7071, -0.7071, -0.7071, 0.7071]
    s = 1 / math.sqrt(2)
    total = [s + 0.5 * s, -s - 0.5 * s, -0.5 * s, 0.5 * s]
    tokens = [t for t in total for _ in range(2)]
    mean = sum(tokens) / 8
    std = math.sqrt(sum((t - mean) ** 2 for t in tokens) / 7 + 1e-8)
    assert adv[:, 0].tolist() == pytest.approx([(t - mean) / std for t in total], abs=1e-4)


def test_compute_advantage_gdpo_reads_keys_from_data():
    class Proto:  # DataProto-like duck type
        def __init__(self):
            self.batch = {"token_level_rewards": torch.zeros(2, 1), "response_mask": torch.ones(2, 1)}
            self.non_tensor_batch = {"uid": np.array(["a", "a"], dtype=object), "acc": np.array([1.0, 0.0])}

    adv, _ = compute_advantage(Proto(), algorithm(adv_estimator="gdpo", gdpo_reward_keys=["acc"],
                                                gdpo_reward_weights=None))
    assert adv[0, 0] > 0 > adv[1, 0]
    with pytest.raises(ValueError, match="gdpo_reward_keys"):
        compute_advantage(Proto(), algorithm(adv_estimator="gdpo", gdpo_reward_keys=["format"]))


def loop_otb(rewards, mask, uid, old_lp, spp, handle_zero_tail=True):
    B, T = rewards.shape
    G = torch.zeros(B, T)
    W = torch.zeros(B, T)
    for b in range(B):
        acc = 0.0
        for t in reversed(range(T)):
            if mask[b, t]:
                acc += rewards[b, t].item()
                G[b, t] = acc
        c = 0.0
        for t in range(T):
            if mask[b, t]:
                c += 1 - 2 * math.exp(old_lp[b, t].item()) + spp[b, t].item()
                W[b, t] = c
    base = torch.zeros(B, T)
    for g in set(uid.tolist()):
        idx = [i for i in range(B) if uid[i] == g]
        if len(idx) < 2:
            continue
        for t in range(T):
            num = sum(G[i, t] * W[i, t] * mask[i, t] for i in idx)
            den = sum(W[i, t] * mask[i, t] for i in idx) + 1e-8
            for i in idx:
                base[i, t] = num / den
        lens = sorted(((int(mask[i].sum()), i) for i in idx), reverse=True)
        if handle_zero_tail and lens[0][0] > lens[1][0]:
            base[lens[0][1], lens[1][0]:] = 0
    return (G - base) * mask, G * mask


def test_optimal_token_baseline_matches_loop_reference():
    torch.manual_seed(0)
    uid = np.array(["a", "a", "a", "b", "b", "c"], dtype=object)
    lengths = torch.tensor([5, 3, 2, 4, 4, 3])
    mask = (torch.arange(6)[None] < lengths[:, None]).float()
    rewards = torch.randn(6, 6) * mask
    old_lp = -torch.rand(6, 6) * 3
    spp = torch.rand(6, 6) * 0.5
    adv, ret = get_adv_estimator("optimal_token_baseline")(
        rewards, mask, index=uid, old_log_probs=old_lp, sum_pi_squared=spp
    )
    ref_adv, ref_ret = loop_otb(rewards, mask, uid, old_lp, spp)
    assert torch.allclose(ret, ref_ret, atol=1e-5)
    assert torch.allclose(adv, ref_adv, atol=1e-4)
    with pytest.raises(ValueError, match="calculate_sum_pi_squared"):
        get_adv_estimator("optimal_token_baseline")(rewards, mask, index=uid)
