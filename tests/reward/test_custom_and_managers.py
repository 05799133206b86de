"""custom_reward_function loading errors; reward managers: token placement, errors, dapo, prime."""

import time

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from megarl.protocol import DataProto
from megarl.reward import RewardError, RewardFunctionError, RewardManager, load_reward_fn, place_scores


class CharTokenizer:
    """id i <-> chr(ord('a') + i); id 0 is pad (decoded only if valid, never here)."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + i) for i in ids)


def _batch(responses, lengths, sources, truths):
    R = max(len(r) for r in responses)
    ids = torch.zeros(len(responses), R, dtype=torch.long)
    mask = torch.zeros(len(responses), R, dtype=torch.long)
    for i, (r, n) in enumerate(zip(responses, lengths)):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, :n] = 1
    return DataProto.from_dict(
        {"responses": ids, "response_mask": mask},
        non_tensors={"data_source": np.array(sources, dtype=object),
                     "reward_model": np.array([{"ground_truth": t} for t in truths], dtype=object),
                     "extra_info": np.array([{"index": i} for i in range(len(truths))], dtype=object)},
    )


def _write(tmp_path, body):
    path = tmp_path / "my_reward.py"
    path.write_text(body)
    return str(path)


def test_custom_function_missing_file_or_name(tmp_path):
    with pytest.raises(RewardFunctionError, match="custom_reward_function.path.*not found"):
        load_reward_fn(OmegaConf.create({"path": str(tmp_path / "nope.py"), "name": "f"}))
    path = _write(tmp_path, "def other(*a):\n    return 1.0\n")
    with pytest.raises(RewardFunctionError, match="custom_reward_function.name='compute_score'"):
        load_reward_fn(OmegaConf.create({"path": path, "name": "compute_score"}))
    bad = tmp_path / "bad.py"
    bad.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(RewardFunctionError, match="importing it failed.*boom"):
        load_reward_fn(OmegaConf.create({"path": str(bad), "name": "f"}))


def test_custom_function_with_kwargs(tmp_path):
    path = _write(tmp_path, "def score(ds, text, gt, extra, bonus=0.0):\n    return float(text == gt) + bonus\n")
    fn = load_reward_fn(OmegaConf.create({"path": path, "name": "score", "reward_kwargs": {"bonus": 0.5}}))
    assert fn("x", "ab", "ab", None) == 1.5
    assert load_reward_fn(OmegaConf.create({"path": None, "name": "compute_score"})).__name__ == "default_compute_score"


def test_place_scores_on_last_valid_token():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    out = place_scores(torch.tensor([1.0, 2.0, 3.0, 4.0]), mask)
    expected = torch.zeros(4, 4)
    expected[0, 2], expected[1, 0], expected[2, 3], expected[3, 0] = 1.0, 2.0, 3.0, 4.0
    assert torch.equal(out, expected)


def _exact(ds, text, gt, extra):
    return {"score": float(text == gt), "acc": text == gt}


def test_naive_manager_scores_decoded_text_and_extra_info():
    # "bc" (ids 1,2) vs truth "bc"; second row has 3 tokens but only 1 valid: "b" vs "bc"
    data = _batch([[1, 2, 0], [1, 2, 3]], [2, 1], ["s", "s"], ["bc", "bc"])
    scores, extra = RewardManager(CharTokenizer(), _exact, "naive", timeout_s=30.0)(data)
    assert torch.equal(scores, torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))
    assert extra["score"] == [1.0, 0.0] and extra["acc"] == [True, False]


def test_batch_manager_gets_lists():
    def batch_fn(sources, texts, truths, extras):  # runs in the scoring process: report through the scores
        assert texts == ["bcd", "e"] and truths == ["x", "y"] and sources == ["s", "s"], texts
        return [len(t) for t in texts]

    data = _batch([[1, 2, 3], [4, 0, 0]], [3, 1], ["s", "s"], ["x", "y"])
    scores, _ = RewardManager(CharTokenizer(), batch_fn, "batch", timeout_s=30.0)(data)
    assert scores[0, 2] == 3.0 and scores[1, 0] == 1.0 and scores.sum() == 4.0


def _raises_on_e(ds, text, gt, extra):
    if text == "e":
        raise ZeroDivisionError("bad row")
    return 1.0


def test_failing_scorer_names_row_and_source():
    data = _batch([[1, 2], [4, 0]], [2, 1], ["ok/src", "broken/src"], ["x", "y"])
    with pytest.raises(RewardError, match=r"row 1 \(data_source='broken/src', scorer _raises_on_e in \S+test_custom_and_managers.py\).*ZeroDivisionError"):
        RewardManager(CharTokenizer(), _raises_on_e, "naive", timeout_s=30.0)(data)
    with pytest.raises(RewardError, match=r"row 1 \(data_source='broken/src', scorer _raises_on_e"):
        RewardManager(CharTokenizer(), _raises_on_e, "prime", timeout_s=30.0)(data)


def _slow_on_b(ds, text, gt, extra):
    if text == "b":
        time.sleep(30)
    return 1.0


def test_prime_manager_parallel_with_timeout():
    data = _batch([[1], [2], [3]], [1, 1, 1], ["s"] * 3, ["x"] * 3)
    start = time.monotonic()
    scores, extra = RewardManager(CharTokenizer(), _slow_on_b, "prime", timeout_s=1.0, processes=3)(data)
    assert scores[:, 0].tolist() == [0.0, 1.0, 1.0]  # the timed-out row scores 0
    assert extra["timeout"] == [1.0, 0.0, 0.0]
    assert time.monotonic() - start < 15  # the hung scorer (30 s) was not waited for


def test_dapo_overlong_penalty():
    # max_response_length 4, buffer 2, factor 1: length 4 -> -1, length 3 -> -0.5, length 2 -> 0
    data = _batch([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]], [4, 3, 2], ["s"] * 3, ["x"] * 3)
    scores, extra = RewardManager(CharTokenizer(), lambda *a: 1.0, "dapo", timeout_s=30.0, overlong=(2, 1.0, 4))(data)
    assert scores.sum(-1).tolist() == [0.0, 0.5, 1.0]
    assert scores[1, 2] == 0.5
    assert extra["overlong_penalty"] == [-1.0, -0.5, 0.0]


def test_missing_reward_fn_key_column():
    data = _batch([[1]], [1], ["s"], ["x"])
    with pytest.raises(KeyError, match="data.reward_fn_key='source'"):
        RewardManager(CharTokenizer(), _exact, "naive", timeout_s=30.0, reward_fn_key="source")(data)
