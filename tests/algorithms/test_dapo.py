import numpy as np
import pytest
import torch

from megarl.algorithms.dapo import apply_overlong_penalty, filter_groups, filter_metric_values, overlong_penalty


def test_filter_groups_keeps_mixed_groups_and_singletons():
    uids = np.array(["a", "a", "b", "b", "c", "d", "d", "d"], dtype=object)
    acc = np.array([1, 0, 1, 1, 0, 0.5, 0.5, 0.5])
    kept, info = filter_groups(uids, acc)
    assert kept.tolist() == [0, 1, 4]
    assert info == {"num_groups": 4, "num_kept_groups": 2, "num_samples": 8, "num_kept_samples": 3}


def test_filter_groups_interleaved_uids():
    kept, _ = filter_groups(np.array(["x", "y", "x", "y"], dtype=object), [1.0, 2.0, 0.0, 2.0])
    assert kept.tolist() == [0, 2]


def test_filter_metric_values():
    scores = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    rewards = torch.tensor([[0.0, 0.5], [2.0, -1.0]])
    assert filter_metric_values("seq_reward", scores, rewards).tolist() == [1.0, 2.0]
    assert filter_metric_values("seq_final_reward", scores, rewards).tolist() == [0.5, 1.0]
    assert filter_metric_values("acc", reward_extra_info={"acc": [1, 0]}).tolist() == [1, 0]
    with pytest.raises(ValueError, match="seq_final_reward"):
        filter_metric_values("accuracy", scores, rewards, {"acc": [1, 0]})


def test_overlong_penalty_by_hand():
    # max 20, buffer 4: no penalty up to 16, -factor * (L - 16) / 4 beyond
    lengths = torch.tensor([10, 16, 17, 18, 20])
    assert overlong_penalty(lengths, 20, 4, 1.0).tolist() == [0.0, 0.0, -0.25, -0.5, -1.0]
    assert overlong_penalty(lengths, 20, 4, 2.0)[-1].item() == -2.0
    with pytest.raises(ValueError, match="overlong_buffer_cfg.len"):
        overlong_penalty(lengths, 20, 0, 1.0)


def test_apply_overlong_penalty_on_last_valid_token():
    scores = torch.zeros(3, 5)
    scores[0, 4] = 1.0
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]])
    out, pen = apply_overlong_penalty(scores, mask, max_response_length=5, overlong_buffer_len=2, penalty_factor=1.0)
    assert pen.tolist() == [-1.0, 0.0, 0.0]
    assert out[0].tolist() == [0, 0, 0, 0, 0.0]
    assert torch.equal(out[1:], scores[1:])
