"""The scoring pool runs calls in parallel (reward.num_workers processes, shared by threads) and
ends a batch at its deadline (reward.phase_timeout), the calls left "pending" (issue 37 item 2; the
managers' handling of such rows: test_reward_timeout.py).

Each call records its process and when it ran, so parallelism is checked by overlapping calls in
distinct processes, not by timing the batch; a hang guard turns a missing bound into a failure.
"""

from __future__ import annotations

import os
import threading
import time

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
