"""Rewards that lie: only real numbers are scores, None ground truths are not scored as "None",
and a failing scorer is reported with where (training / validation, step) and what (row,
prompt, ground truth, response), its traceback kept for the log file, not printed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from megarl.protocol import DataProto
from megarl.reward import RewardError, RewardManager, default_compute_score


class CharTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + i) for i in ids)


def _batch(texts, truths, validate=False, step=3):
    """One-token responses; prompts "hh" (ids 7, 7) left-padded by one pad token."""
    ids = torch.tensor([[ord(t) - ord("a")] for t in texts])
    prompts = torch.tensor([[0, 7, 7]] * len(texts))
    attention = torch.tensor([[0, 1, 1, 1]] * len(texts))
    return DataProto.from_dict(
        {"responses": ids, "response_mask": torch.ones_like(ids), "prompts": prompts, "attention_mask": attention},
        non_tensors={"data_source": np.array(["src"] * len(texts), dtype=object),
                     "reward_model": np.array([{"ground_truth": t} for t in truths], dtype=object),
                     "extra_info": np.array([{"index": i} for i in range(len(texts))], dtype=object)},
        meta_info={"global_step": step, "validate": validate},
    )


def _score(manager: str, fn, data):
    reward = RewardManager(CharTokenizer(), fn, manager, timeout_s=30.0)
    try:
        return reward(data)
    finally:
        reward.close()


@pytest.mark.parametrize("manager", ["naive", "prime"])
@pytest.mark.parametrize("value", ["1.0", True, np.bool_(True), torch.tensor(1.0), None, [1.0], {"score": "1"}, {"score": True}])
def test_non_numbers_are_refused_naming_the_row_and_type(manager, value):
    def fn(ds, text, gt, extra):
        return value if text == "b" else 1.0

    with pytest.raises(RewardError) as info:
        _score(manager, fn, _batch(["a", "b"], ["x", "y"]))
    text = str(info.value)
    assert "row 1" in text and "real number" in text and repr(value if not isinstance(value, dict) else value["score"]) in text, text


def test_batch_manager_refuses_non_numbers_too():
    with pytest.raises(RewardError, match=r"row 1.*'0.5'.*real number"):
        _score("batch", lambda s, t, g, e: [1.0, "0.5"], _batch(["a", "b"], ["x", "y"]))


@pytest.mark.parametrize("value", [1, 0.25, np.float32(0.5), np.int64(2), {"score": 0.5, "acc": True}])
def test_real_numbers_are_scores(value):
    scores, extra = _score("naive", lambda *a: value, _batch(["a"], ["x"]))
    want = value["score"] if isinstance(value, dict) else float(value)
    assert scores.sum().item() == pytest.approx(want)


def test_builtin_scorer_refuses_a_none_ground_truth_instead_of_comparing_with_the_string_none():
    with pytest.raises(ValueError, match="ground_truth is None"):
        default_compute_score("math", "the answer is \\boxed{None}", None)
    assert default_compute_score("math", "the answer is \\boxed{None}", "None") == 1.0  # the lie the check prevents


@pytest.mark.parametrize("validate, where", [(False, "training"), (True, "validation")])
def test_scorer_exception_names_phase_step_row_prompt_truth_and_response(validate, where):
    def fn(ds, text, gt, extra):
        if gt == "7":
            raise ZeroDivisionError("division by zero in my parser")
        return 0.0

    with pytest.raises(RewardError) as info:
        _score("naive", fn, _batch(["a", "c"], ["1", "7"], validate=validate, step=5))
    error = info.value
    text = str(error)
    for word in (where, "step 5", "row 1", "data_source='src'", "prompt='hh'", "ground_truth='7'", "response='c'",
                 "ZeroDivisionError: division by zero in my parser"):
        assert word in text, (word, text)
    assert "Traceback" not in text
    assert "Traceback" in error.scorer_traceback and "in fn" in error.scorer_traceback


@pytest.mark.parametrize("manager", ["naive", "batch"])
@pytest.mark.parametrize("value", [1e300, -1e39, {"score": 3.5e38}])
def test_a_score_that_overflows_float32_names_row_source_and_scorer(manager, value):
    """Issue 37 item 3: finite as a Python float, inf in the float32 score tensor."""
    def bad_scorer(ds, text, gt, extra):
        return value if text == "b" else 1.0

    def bad_batch_scorer(sources, texts, truths, extras):
        return [bad_scorer(*row) for row in zip(sources, texts, truths, extras)]

    with pytest.raises(RewardError) as info:
        _score(manager, bad_scorer if manager == "naive" else bad_batch_scorer, _batch(["a", "b"], ["x", "y"]))
    text = str(info.value)
    shown = value["score"] if isinstance(value, dict) else value
    for word in ("row 1", "data_source='src'", "bad_scorer" if manager == "naive" else "bad_batch_scorer", __file__,
                 repr(shown), "float32", "finite"):
        assert word in text, (word, text)


def test_largest_float32_score_is_accepted_and_builtin_scorer_is_named():
    scores, _ = _score("naive", lambda *a: 3.4e38, _batch(["a"], ["x"]))
    assert torch.isfinite(scores).all() and scores.sum().item() == pytest.approx(3.4e38, rel=1e-6)
    with pytest.raises(RewardError, match=r"row 0 \(data_source='src', scorer megarl's built-in scorer"):
        _score("naive", default_compute_score, _batch(["a"], ["x"]))  # 'src' has no built-in scorer
