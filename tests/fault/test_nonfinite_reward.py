"""A reward function returning NaN/Inf is rejected at the reward stage, naming the row."""

import math

import numpy as np
import pytest
import torch

from megarl.protocol import DataProto
from megarl.reward import RewardError, RewardManager


class _CharTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + i) for i in ids)


def _batch():
    ids = torch.tensor([[1, 2], [3, 0], [4, 5]])
    mask = torch.tensor([[1, 1], [1, 0], [1, 1]])
    return DataProto.from_dict({"responses": ids, "response_mask": mask},
                               non_tensors={"data_source": np.array(["s0", "s1", "s2"], dtype=object)})


@pytest.mark.parametrize("manager", ["naive", "dapo"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), {"score": -math.inf, "acc": 1.0}])
def test_nonfinite_score_names_the_row(manager, bad):
    fn = lambda ds, text, gt, extra: bad if text == "d" else 1.0  # noqa: E731  row 1 decodes to "d"
    with pytest.raises(RewardError, match=r"row 1 \(data_source='s1', scorer .*score is -?(nan|inf).*finite number"):
        RewardManager(_CharTokenizer(), fn, manager, timeout_s=30.0)(_batch())


def test_batch_manager_nonfinite_score_names_the_row():
    fn = lambda ds, texts, gts, extras: [1.0, 0.5, float("nan")]  # noqa: E731
    with pytest.raises(RewardError, match=r"row 2 \(data_source='s2', scorer .*score is nan"):
        RewardManager(_CharTokenizer(), fn, "batch", timeout_s=30.0)(_batch())


def test_finite_scores_pass():
    scores, extra = RewardManager(_CharTokenizer(), lambda *a: 0.5, "naive", timeout_s=30.0)(_batch())
    assert extra["score"] == [0.5, 0.5, 0.5] and torch.isfinite(scores).all()
