import math

import numpy as np
import pytest
import torch

from algo_config import algorithm
from megarl.algorithms import ADV_ESTIMATORS, compute_advantage, get_adv_estimator

UID = np.array(["a", "a", "a", "b", "b", "c"], dtype=object)
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 0]])
# Outcome scores 1, 0, 2 (group a), 3, 3 (group b, constant), 5 (singleton c); rewards put on
# the last valid token, plus junk at masked positions that must be ignored.
REWARDS = torch.tensor(
    [[0.0, 1.0, 9.0], [0.0, 9.0, 9.0], [0.0, 0.0, 2.0], [0.0, 3.0, 9.0], [3.0, 9.0, 9.0], [0.0, 5.0, 9.0]]
)
SCORES = [1.0, 0.0, 2.0, 3.0, 3.0, 5.0]


def per_seq(adv):
    """The single advantage value broadcast over each row's valid tokens (checked constant)."""
    out = []
    for row, m in zip(adv, MASK):
        vals = row[m.bool()]
        assert torch.allclose(vals, vals[0].expand_as(vals))
        assert torch.all(row[~m.bool()] == 0)
        out.append(vals[0].item())
    return out


def test_grpo_by_hand():
    adv, ret = get_adv_estimator("grpo")(REWARDS, MASK, index=UID, norm_adv_by_std_in_grpo=True, epsilon=1e-6)
    # group a: mean 1, unbiased std 1; group b: std 0 -> 0; singleton: mean 0, std 1
    expect = [0.0, -1 / (1 + 1e-6), 1 / (1 + 1e-6), 0.0, 0.0, 5 / (1 + 1e-6)]
    assert per_seq(adv) == pytest.approx(expect, abs=1e-6)
    assert torch.equal(adv, ret)


def test_dr_grpo_no_std():
    adv, _ = get_adv_estimator("grpo")(REWARDS, MASK, index=UID, norm_adv_by_std_in_grpo=False)
    assert per_seq(adv) == pytest.approx([0.0, -1.0, 1.0, 0.0, 0.0, 5.0])


def test_grpo_zero_mean_per_group_and_finite_for_constant_groups():
    rng = np.random.default_rng(0)
    uids = np.array([f"p{i // 4}" for i in range(32)], dtype=object)
    scores = torch.tensor(rng.integers(0, 2, size=32), dtype=torch.float32)
    scores[:4] = 1.0  # a constant group
    rewards = torch.zeros(32, 5)
    rewards[:, 0] = scores
    mask = torch.ones(32, 5, dtype=torch.long)
    adv, _ = get_adv_estimator("grpo")(rewards, mask, index=uids, norm_adv_by_std_in_grpo=True)
    assert torch.isfinite(adv).all()
    per = adv[:, 0].view(8, 4)
    assert torch.allclose(per.sum(-1), torch.zeros(8), atol=1e-5)
    assert torch.all(per[0] == 0)


def test_rloo_by_hand():
    adv, _ = get_adv_estimator("rloo")(REWARDS, MASK, index=UID)
    # a: 1 - (0+2)/2 = 0, 0 - 1.5 = -1.5, 2 - 0.5 = 1.5; b: 0, 0; singleton keeps score
    assert per_seq(adv) == pytest.approx([0.0, -1.5, 1.5, 0.0, 0.0, 5.0])


def test_opo_by_hand():
    adv, _ = get_adv_estimator("opo")(REWARDS, MASK, index=UID)
    # a: lengths 2, 1, 3 -> baseline (2*1 + 0 + 3*2) / 6 = 4/3; b: (2*3 + 1*3)/3 = 3
    assert per_seq(adv) == pytest.approx([1 - 4 / 3, -4 / 3, 2 - 4 / 3, 0.0, 0.0, 5.0], abs=1e-6)


def test_gpg_by_hand():
    adv, _ = get_adv_estimator("gpg")(REWARDS, MASK, index=UID)
    alpha = 6 / 5  # five non-zero scores
    assert per_seq(adv) == pytest.approx([0.0, -alpha, alpha, 0.0, 0.0, 5 * alpha], abs=1e-6)


def test_reinforce_plus_plus_baseline_by_hand():
    adv, _ = get_adv_estimator("reinforce_plus_plus_baseline")(REWARDS, MASK, index=UID)
    centered = [0.0, -1.0, 1.0, 0.0, 0.0, 5.0]
    tokens = [c for c, m in zip(centered, MASK) for _ in range(int(m.sum()))]
    mean = sum(tokens) / len(tokens)
    std = math.sqrt(sum((t - mean) ** 2 for t in tokens) / (len(tokens) - 1) + 1e-8)
    assert per_seq(adv) == pytest.approx([(c - mean) / std for c in centered], abs=1e-5)


def test_reinforce_plus_plus_by_hand():
    rewards = torch.tensor([[1.0, 0.0, 2.0], [0.0, 4.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = get_adv_estimator("reinforce_plus_plus")(rewards, mask, gamma=0.5)
    g = [[1 + 0.5 * 0 + 0.25 * 2, 0 + 0.5 * 2, 2.0], [2.0, 4.0, 0.0]]
    assert torch.allclose(ret, torch.tensor(g))
    flat = [1.5, 1.0, 2.0, 2.0, 4.0]
    mean = sum(flat) / 5
    std = math.sqrt(sum((x - mean) ** 2 for x in flat) / 4 + 1e-8)
    assert adv[0, 0].item() == pytest.approx((1.5 - mean) / std, rel=1e-5)
    assert adv[1, 2].item() == 0.0


def test_remax_by_hand():
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv, ret = get_adv_estimator("remax")(rewards, mask, reward_baselines=torch.tensor([0.25, 1.0]))
    assert torch.allclose(ret, torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))
    assert torch.allclose(adv, torch.tensor([[0.75, 0.75, 0.0], [-1.0, -1.0, -1.0]]))
    with pytest.raises(ValueError, match="reward_baselines"):
        get_adv_estimator("remax")(rewards, mask)


def test_masked_rewards_never_leak_into_outcome_estimators():
    junk = REWARDS.clone()
    junk[MASK == 0] = -123.0
    for name in ["grpo", "rloo", "opo", "gpg", "reinforce_plus_plus_baseline", "grpo_passk_skip"]:
        if name not in ADV_ESTIMATORS:
            continue
        a, _ = get_adv_estimator(name)(REWARDS, MASK, index=UID, norm_adv_by_std_in_grpo=True)
        b, _ = get_adv_estimator(name)(junk, MASK, index=UID, norm_adv_by_std_in_grpo=True)
        assert torch.equal(a, b), name


def test_missing_uid_is_a_clear_error():
    with pytest.raises(ValueError, match="uid"):
        get_adv_estimator("grpo")(REWARDS, MASK, norm_adv_by_std_in_grpo=True)


def test_unknown_estimator_lists_valid_names():
    with pytest.raises(ValueError, match="algorithm.adv_estimator") as e:
        get_adv_estimator("grpoo")
    assert "'grpo'" in str(e.value) and "'gae'" in str(e.value)


def test_compute_advantage_from_mapping_and_config():
    data = {"token_level_rewards": REWARDS, "response_mask": MASK, "uid": UID}
    adv, _ = compute_advantage(data, algorithm(adv_estimator="grpo", norm_adv_by_std_in_grpo=False))
    assert per_seq(adv) == pytest.approx([0.0, -1.0, 1.0, 0.0, 0.0, 5.0])
