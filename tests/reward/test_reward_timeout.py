"""reward.timeout bounds every scoring call, for every reward manager.

A call that does not return within ``reward.timeout`` seconds is abandoned (its process is
killed), the sample scores 0.0 (verl's rule), ``reward_extra_info["timeout"]`` marks it
and the first occurrence is printed with the sample. A hang guard (a thread joined with a
limit) makes a missing timeout fail the test instead of hanging it.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from megarl.config.files import CONFIG_DIR, CONFIG_NAME
from megarl.protocol import DataProto
from megarl.reward import RewardError, RewardManager

CONFIG = Path(CONFIG_DIR) / f"{CONFIG_NAME}.yaml"
# A scorer that never returns on the response "b", and spins the CPU (no GIL release) on "c".
SCORER = """
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "b":
        time.sleep(10**6)
    if solution_str == "c":
        while True:
            pass
    return 1.0

def batch_score(data_sources, solution_strs, ground_truths, extra_infos):
    if "b" in solution_strs:
        time.sleep(10**6)
    return [1.0] * len(solution_strs)
"""


class CharTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + i) for i in ids)


def _batch(texts: list[str]) -> DataProto:
    ids = torch.tensor([[ord(t) - ord("a")] for t in texts])
    return DataProto.from_dict(
        {"responses": ids, "response_mask": torch.ones_like(ids), "prompts": ids.clone(), "attention_mask": torch.ones(len(texts), 2, dtype=torch.long)},
        non_tensors={"data_source": np.array(["s"] * len(texts), dtype=object),
                     "reward_model": np.array([{"ground_truth": "a"}] * len(texts), dtype=object),
                     "extra_info": np.array([{"index": i} for i in range(len(texts))], dtype=object)},
        meta_info={"global_step": 7, "validate": False},
    )


def _manager(tmp_path, manager: str, timeout: float, name: str = "compute_score", more: tuple[str, ...] = ()):
    from megarl.reward import build_reward_manager

    scorer = tmp_path / "scorer.py"
    scorer.write_text(SCORER)
    from megarl.config import load_config, typed_config

    cfg = load_config([f"reward.reward_manager.name={manager}", f"reward.custom_reward_function.path={scorer}",
                       f"reward.custom_reward_function.name={name}", f"reward.timeout={timeout}", *more])
    return build_reward_manager(typed_config(cfg), CharTokenizer())


def _guarded(fn, limit_s: float = 60.0):
    """fn() in a thread; fails the test (instead of hanging it) when it runs past limit_s."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as error:  # re-raised in the test
            out["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(limit_s)
    assert not thread.is_alive(), f"the reward call did not return within {limit_s} s (no timeout applied)"
    if "error" in out:
        raise out["error"]
    return out["value"], time.monotonic() - start


@pytest.mark.parametrize("manager", ["naive", "dapo", "prime"])
def test_a_hung_scoring_call_is_cut_at_the_timeout(tmp_path, capsys, manager):
    reward = _manager(tmp_path, manager, timeout=1.0)
    try:
        (scores, extra), took = _guarded(lambda: reward(_batch(["a", "b", "c", "a"])))
        assert scores.sum(-1).tolist() == [1.0, 0.0, 0.0, 1.0]  # timed-out samples score 0.0
        assert extra["timeout"] == [0.0, 1.0, 1.0, 0.0]
        assert took < 20
        out = capsys.readouterr().out
        assert out.count("reward.timeout") == 1, out  # the first occurrence only, with the sample
        assert "row 1" in out and "step 7" in out and "training" in out and "'b'" in out and "0.0" in out, out
        # the pool is usable after its processes were killed
        (scores, extra), _ = _guarded(lambda: reward(_batch(["a", "a"])))
        assert scores.sum(-1).tolist() == [1.0, 1.0] and extra["timeout"] == [0.0, 0.0]
    finally:
        reward.close()


def test_batch_manager_call_is_bounded_too(tmp_path):
    reward = _manager(tmp_path, "batch", timeout=1.0, name="batch_score")
    try:
        (scores, extra), took = _guarded(lambda: reward(_batch(["a", "b"])))
        assert scores.sum(-1).tolist() == [0.0, 0.0] and extra["timeout"] == [1.0, 1.0]
        (scores, _), _ = _guarded(lambda: reward(_batch(["a", "a"])))
        assert scores.sum(-1).tolist() == [1.0, 1.0]
    finally:
        reward.close()


def test_scores_and_errors_are_unchanged_by_the_process_boundary(tmp_path):
    """Same results as calling the scorer directly; a scorer error still names the row."""
    from megarl.reward import RewardError

    reward = _manager(tmp_path, "naive", timeout=30.0)
    try:
        (scores, extra), _ = _guarded(lambda: reward(_batch(["a", "a", "d"])))
        assert scores.sum(-1).tolist() == [1.0, 1.0, 1.0] and extra["timeout"] == [0.0, 0.0, 0.0]
    finally:
        reward.close()
    (tmp_path / "boom.py").write_text("def compute_score(*a, **k):\n    raise KeyError('no such field')\n")
    from megarl.config import load_config, typed_config
    from megarl.reward import build_reward_manager

    cfg = load_config([f"reward.custom_reward_function.path={tmp_path / 'boom.py'}"])

    reward = build_reward_manager(typed_config(cfg), CharTokenizer())
    try:
        with pytest.raises(RewardError, match=r"row 0.*KeyError.*no such field"):
            _guarded(lambda: reward(_batch(["a"])))
    finally:
        reward.close()


def test_timeout_key_is_in_the_yaml_and_validated():
    from megarl.config import check_schema
    from megarl.config.compose import load_config

    cfg = OmegaConf.load(CONFIG)
    assert cfg.reward.timeout == 300  # verl's reward.timeout default (RateLimitedRewardManager)
    assert not check_schema(load_config(["reward.timeout=0.5"]))
    assert [i.key for i in check_schema(load_config(["reward.timeout=0"]))] == ["reward.timeout"]


# reward.phase_timeout: the whole batch's bound (issue 37 item 2)
def _hang_on_b(data_source, text, truth, extra):
    if text == "b":
        time.sleep(10**6)
    return 1.0


@pytest.mark.parametrize("manager", ["naive", "batch"])
def test_rows_left_when_the_phase_ends_stop_the_run_naming_them(manager):
    fn = _hang_on_b if manager == "naive" else (lambda s, texts, g, e: [_hang_on_b(None, t, None, None) for t in texts])
    reward = RewardManager(CharTokenizer(), fn, manager, timeout_s=10**6, processes=2, phase_timeout_s=1.0)
    try:
        with pytest.raises(RewardError) as info:
            reward(_batch(["a", "b", "b", "a", "a"]))
    finally:
        reward.close()
    text = str(info.value)
    left = "rows 1 (s), 2 (s), 3 (s), 4 (s)" if manager == "naive" else "rows 0 (s), 1 (s), 2 (s), 3 (s), 4 (s)"
    for word in ("reward.phase_timeout=1 s", left, "step 7", "reward.num_workers", "trainer.nan_policy=skip"):
        assert word in text, (word, text)


def test_under_nan_policy_skip_they_score_zero_and_are_named(capsys):
    reward = RewardManager(CharTokenizer(), _hang_on_b, "naive", timeout_s=10**6, processes=3, phase_timeout_s=1.0,
                           skip_unscored=True)
    try:
        scores, extra = reward(_batch(["a", "b", "a", "b"]))
    finally:
        reward.close()
    assert scores.sum(-1).tolist() == [1.0, 0.0, 1.0, 0.0] and extra["timeout"] == [0.0, 1.0, 0.0, 1.0]
    out = capsys.readouterr().out
    assert "2 of 4 rows were not scored in time: rows 1 (s), 3 (s)" in out and "nan_policy=skip" in out, out


def test_num_workers_and_phase_timeout_keys_reach_the_manager():
    from megarl.config import load_config, typed_config
    from megarl.reward.managers import reward_spec

    default = reward_spec(typed_config(load_config(["reward.timeout=7"])))
    assert (default.processes, default.phase_timeout_s, default.skip_unscored) == (8, 14.0, False)  # verl's 8; 2 x timeout
    spec = reward_spec(typed_config(load_config(["reward.num_workers=3", "reward.phase_timeout=40",
                                                 "trainer.nan_policy=skip"])))
    assert (spec.processes, spec.phase_timeout_s, spec.skip_unscored) == (3, 40.0, True)
