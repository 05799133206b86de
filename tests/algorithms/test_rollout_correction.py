import math

import pytest
import torch

from algo_config import rollout_correction
from megarl.algorithms.rollout_correction import (
    compute_offpolicy_metrics,
    compute_rollout_correction,
    compute_rollout_is_weights,
    compute_rollout_rejection_mask,
    parse_is_threshold,
)

# log(pi_old / pi_rollout): seq 0 = [log 3, log 0.5, (pad)], seq 1 = [log 1.5, (pad), (pad)]
LR = torch.tensor([[math.log(3.0), math.log(0.5), 7.0], [math.log(1.5), 9.0, 9.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


def test_token_level_truncated_weights_by_hand():
    w, m = compute_rollout_is_weights(LR, MASK, "token", 2.0, False)
    assert torch.allclose(w, torch.tensor([[2.0, 0.5, 0.0], [1.5, 0.0, 0.0]], dtype=w.dtype))
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(1 / 3)
    assert m["rollout_is_ratio_fraction_low"] == 0.0  # 0.5 is not below 1/2
    mean, mean_sq = 4.0 / 3, (4 + 0.25 + 2.25) / 3
    assert m["rollout_is_mean"] == pytest.approx(mean)
    assert m["rollout_is_eff_sample_size"] == pytest.approx(mean**2 / mean_sq)


def test_sequence_and_geometric_levels_by_hand():
    w, m = compute_rollout_is_weights(LR, MASK, "sequence", 2.0, False)
    # seq 0: 3 * 0.5 = 1.5; seq 1: 1.5
    assert torch.allclose(w, torch.tensor([[1.5, 1.5, 0.0], [1.5, 0.0, 0.0]], dtype=w.dtype))
    assert m["rollout_is_eff_sample_size"] == pytest.approx(1.0)
    w, _ = compute_rollout_is_weights(LR, MASK, "geometric", 2.0, False)
    assert w[0, 0].item() == pytest.approx(math.sqrt(1.5)) and w[1, 0].item() == pytest.approx(1.5)


def test_icepop_zeroes_out_of_band_weights():
    w, m = compute_rollout_is_weights(LR, MASK, "token", "0.6_2.0", False)
    assert torch.allclose(w, torch.tensor([[0.0, 0.0, 0.0], [1.5, 0.0, 0.0]], dtype=w.dtype))


def test_batch_normalize():
    w, m = compute_rollout_is_weights(LR, MASK, "token", 2.0, rollout_is_batch_normalize=True)
    assert m["rollout_is_batch_norm_factor"] == pytest.approx(4 / 3)
    assert w[MASK.bool()].mean().item() == pytest.approx(1.0)


def test_truncated_weights_never_exceed_threshold():
    torch.manual_seed(0)
    lr = torch.randn(16, 32) * 3
    mask = (torch.rand(16, 32) > 0.2).long()
    for level in ("token", "sequence", "geometric"):
        for thr in (1.2, 2.0, 5.0):
            w, _ = compute_rollout_is_weights(lr, mask, level, thr, False)
            assert w.max().item() <= thr + 1e-6
            assert torch.all(w[mask == 0] == 0)


def test_threshold_parsing_errors_name_the_key():
    assert parse_is_threshold("0.5_2") == (2.0, 0.5)
    for bad in ("abc", "2_1", -1.0, True):
        with pytest.raises(ValueError, match="rollout_is_threshold"):
            parse_is_threshold(bad)
    with pytest.raises(ValueError, match="rollout_is"):
        compute_rollout_is_weights(LR, MASK, "seq", 2.0, False)


def test_rejection_token_and_sequence_levels():
    # token_k1 keeps log(0.4) <= -lr <= log(2.5): lr = log 3 -> -1.0986 < -0.916 rejected
    mask, m = compute_rollout_rejection_mask(LR, MASK, "token_k1", "0.4_2.5", None)
    assert mask.tolist() == [[0, 1, 0], [1, 0, 0]]
    assert m["rollout_rs_masked_fraction"] == pytest.approx(1 / 3)
    assert m["rollout_rs_seq_masked_fraction"] == pytest.approx(1 / 2)
    # seq_sum_k2: seq 0 = 0.5 (log^2 3 + log^2 0.5) = 0.8437; seq 1 = 0.5 log^2 1.5 = 0.0822
    mask, _ = compute_rollout_rejection_mask(LR, MASK, "seq_sum_k2", 0.5, None)
    assert mask.tolist() == [[0, 0, 0], [1, 0, 0]]
    # seq_max_k3: seq0 max(3-1-log3, 0.5-1-log0.5) = 0.9014; seq1 = 0.5-log1.5 = 0.0945
    mask, _ = compute_rollout_rejection_mask(LR, MASK, "seq_max_k3", 0.95, None)
    assert mask.tolist() == [[1, 1, 0], [1, 0, 0]]
    # combined options: all must pass; shared threshold list
    mask, m = compute_rollout_rejection_mask(LR, MASK, "seq_mean_k1,token_k2", "0.5_2.0,0.1", None)
    # seq_mean_k1: seq0 -(log 3 + log 0.5)/2 = -0.2027 in [-0.693, 0.693]; token_k2: 0.603 > 0.1, 0.240 > 0.1, 0.0822 ok
    assert mask.tolist() == [[0, 0, 0], [1, 0, 0]]
    assert "rollout_rs_token_k2_masked_fraction" in m


def test_rejection_config_errors():
    with pytest.raises(ValueError, match="seq_sum_k1"):
        compute_rollout_rejection_mask(LR, MASK, "seq_k1", 2.0, None)
    with pytest.raises(ValueError, match="rollout_rs_threshold"):
        compute_rollout_rejection_mask(LR, MASK, "token_k2", None, None)
    with pytest.raises(ValueError, match="rollout_rs_threshold"):
        compute_rollout_rejection_mask(LR, MASK, "token_k2,seq_sum_k3", "1,2,3", None)


def test_offpolicy_metrics_by_hand():
    roll = torch.tensor([[-1.0, -2.0], [-1.0, 0.0]], dtype=torch.float64)
    old = torch.tensor([[-1.5, -1.0], [-0.5, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 0]])
    m = compute_offpolicy_metrics(old, roll, mask)
    assert m["kl"] == pytest.approx((0.5 - 1.0 - 0.5) / 3)
    # per-seq mean log p: train [-1.25, -0.5], rollout [-1.5, -1.0]
    assert m["training_ppl"] == pytest.approx((math.exp(1.25) + math.exp(0.5)) / 2)
    assert m["rollout_log_ppl"] == pytest.approx(1.25)
    assert m["log_ppl_diff"] == pytest.approx((-0.25 - 0.5) / 2)
    rho = [math.exp(-0.5), math.exp(1.0), math.exp(0.5)]
    assert m["chi2_token"] == pytest.approx(sum(r * r for r in rho) / 3 - 1)
    assert m["chi2_seq"] == pytest.approx((math.exp(2 * 0.5) + math.exp(2 * 0.5)) / 2 - 1)


def test_compute_rollout_correction_from_config():
    old = torch.zeros(2, 3)
    roll = -LR.float()
    cfg = rollout_correction(rollout_is="token", rollout_is_threshold=2.0, rollout_is_batch_normalize=False,
                             rollout_rs="token_k1", rollout_rs_threshold="0.4_2.5", rollout_token_veto_threshold=None)
    w, mask, m = compute_rollout_correction(old, roll, MASK, cfg)
    assert torch.allclose(w, torch.tensor([[2.0, 0.5, 0.0], [1.5, 0.0, 0.0]]))
    assert mask.tolist() == [[0, 1, 0], [1, 0, 0]]
    assert all(k.startswith("rollout_corr/") for k in m)
    w, mask, _ = compute_rollout_correction(
        old, roll, MASK, rollout_correction(rollout_is=None, rollout_rs=None, rollout_token_veto_threshold=None)
    )
    assert w is None and torch.equal(mask, MASK)
    with pytest.raises(ValueError, match="must match"):
        compute_rollout_correction(old, roll[:, :2], MASK, cfg)


def test_ratio_rejection_levels_by_hand():
    # token ratios: seq0 [3, 0.5], seq1 [1.5]; bounds [0.5, 2] (1/u default)
    mask, _ = compute_rollout_rejection_mask(LR, MASK, "token", 2.0, None)
    assert mask.tolist() == [[0, 1, 0], [1, 0, 0]]
    # explicit lower 0.6 also rejects the 0.5 token
    mask, _ = compute_rollout_rejection_mask(LR, MASK, "token", 2.0, rollout_rs_threshold_lower=0.6)
    assert mask.tolist() == [[0, 0, 0], [1, 0, 0]]
    # sequence products 1.5 and 1.5 pass [1/1.6, 1.6]; geometric sqrt(1.5) = 1.22 > 1.2 fails
    mask, _ = compute_rollout_rejection_mask(LR, MASK, "sequence", 1.6, None)
    assert mask.tolist() == [[1, 1, 0], [1, 0, 0]]
    mask, m = compute_rollout_rejection_mask(LR, MASK, "geometric", "0.5_1.2", None)
    assert mask.tolist() == [[0, 0, 0], [0, 0, 0]]
    assert m["rollout_rs_seq_masked_fraction"] == 1.0


def test_token_veto_and_config_defaults():
    cfg = rollout_correction(rollout_is=None, rollout_is_threshold=4.0, rollout_rs="token", rollout_rs_threshold=None,
                             rollout_rs_threshold_lower=None, rollout_token_veto_threshold=0.6)
    old = torch.zeros(2, 3)
    w, mask, m = compute_rollout_correction(old, -LR.float(), MASK, cfg)
    # rs bounds default to the IS threshold [0.25, 4]: all pass; the veto removes seq 0 (token 0.5 < 0.6)
    assert w is None and mask.tolist() == [[0, 0, 0], [1, 0, 0]]
    assert m["rollout_corr/rollout_is_veto_fraction"] == 0.5
    with pytest.raises(ValueError, match="rollout_rs_threshold"):
        compute_rollout_correction(
            old, -LR.float(), MASK, rollout_correction(rollout_rs="token_k2", rollout_rs_threshold=None)
        )
