"""The reward phase scores rows in parallel (reward.num_workers processes) and has a total bound
(reward.phase_timeout): rows not scored by then stop the run naming them, or under
trainer.nan_policy=skip score 0.0 with a warning naming them (issue 37 item 2).

Each call records its process and when it ran, so parallelism is checked by overlapping calls in
distinct processes, not by timing the batch; a hang guard turns a missing bound into a failure.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
import torch

from megarl.protocol import DataProto
from megarl.reward import RewardError, RewardManager
from megarl.reward.scoring_pool import ScoringPool


def _timed(seconds: float) -> tuple[int, float, float]:
    start = time.monotonic()
    time.sleep(seconds)
    return os.getpid(), start, time.monotonic()


def _overlap(values: list[tuple[int, float, float]]) -> bool:
    """All calls ran at the same moment (each started before any ended)."""
    return max(start for _, start, _ in values) < min(end for _, _, end in values)


def test_calls_run_in_parallel_up_to_processes():
    pool = ScoringPool(_timed, processes=3, timeout_s=60)
    try:
        outcomes = pool.run([(0.5,)] * 3)
        values = [o.value for o in outcomes]
        assert [o.kind for o in outcomes] == ["ok"] * 3 and len({pid for pid, _, _ in values}) == 3 and _overlap(values)
        one = ScoringPool(_timed, processes=1, timeout_s=60)
        try:
            serial = [o.value for o in one.run([(0.2,)] * 2)]
        finally:
            one.close()
        assert not _overlap(serial)  # one process: one call after the other
    finally:
        pool.close()


def test_threads_share_the_processes():
    """Streamed scoring: several threads run one call each; together they never use more than `processes`."""
    pool = ScoringPool(_timed, processes=2, timeout_s=60)
    results: list = []
    try:
        threads = [threading.Thread(target=lambda: results.extend(pool.run([(0.3,)]))) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert [o.kind for o in results] == ["ok"] * 4
        assert len({o.value[0] for o in results}) <= 2 and len(pool._children) == 2
    finally:
        pool.close()


def _hang_on_odd(x: int) -> int:
    if x % 2:
        time.sleep(10**6)
    return x


def test_the_deadline_leaves_unfinished_calls_pending_and_kills_their_processes():
    pool = ScoringPool(_hang_on_odd, processes=2, timeout_s=10**6)
    try:
        start = time.monotonic()
        outcomes = pool.run([(1,), (3,), (0,), (2,)], deadline=time.monotonic() + 1.0)
        assert time.monotonic() - start < 30  # hang guard: the per-call timeout alone would never end it
        # both processes hung on rows 0 and 1; rows 2 and 3 never got one
        assert [o.kind for o in outcomes] == ["pending"] * 4
        assert not pool._children  # the hung processes were killed
        assert [o.value for o in pool.run([(0,), (2,)])] == [0, 2]  # and replaced
        # a call cut by its own timeout inside the deadline is a timeout, not pending
        short = ScoringPool(_hang_on_odd, processes=2, timeout_s=0.5)
        try:
            assert [o.kind for o in short.run([(1,), (2,)], deadline=time.monotonic() + 30)] == ["timeout", "ok"]
        finally:
            short.close()
    finally:
        pool.close()


class CharTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + i) for i in ids)


def _batch(texts: list[str]) -> DataProto:
    ids = torch.tensor([[ord(t) - ord("a")] for t in texts])
    return DataProto.from_dict(
        {"responses": ids, "response_mask": torch.ones_like(ids)},
        non_tensors={"data_source": np.array([f"src{i}" for i in range(len(texts))], dtype=object),
                     "reward_model": np.array([{"ground_truth": "a"}] * len(texts), dtype=object),
                     "extra_info": np.array([{}] * len(texts), dtype=object)},
        meta_info={"global_step": 4, "validate": False},
    )


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
    left = "rows 1 (src1), 2 (src2), 3 (src3), 4 (src4)" if manager == "naive" else "rows 0 (src0), 1 (src1)"
    for word in ("reward.phase_timeout=1 s", left, "step 4", "reward.num_workers", "trainer.nan_policy=skip"):
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
    assert "2 of 4 rows were not scored in time: rows 1 (src1), 3 (src3)" in out and "nan_policy=skip" in out, out


def test_num_workers_and_phase_timeout_keys_reach_the_manager(tmp_path):
    from megarl.config import load_config, typed_config
    from megarl.reward.managers import reward_spec

    default = reward_spec(typed_config(load_config(["reward.timeout=7"])))
    assert (default.processes, default.phase_timeout_s, default.skip_unscored) == (8, 14.0, False)  # verl's 8; 2 x timeout
    spec = reward_spec(typed_config(load_config(["reward.num_workers=3", "reward.phase_timeout=40",
                                                 "trainer.nan_policy=skip"])))
    assert (spec.processes, spec.phase_timeout_s, spec.skip_unscored) == (3, 40.0, True)
