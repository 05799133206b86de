"""Rank pause points (megarl/utils/fault_points.py): the named rank stalls at its n-th pass, every other
rank and pass goes on. Each case runs in a child process: a pause blocks forever."""

from __future__ import annotations

import os
import subprocess
import sys

CHILD = """
import sys
from megarl.utils.fault_points import rank_pause_point
for n in range(1, 4):
    rank_pause_point("update_microbatch")
    print("passed", n, flush=True)
"""


def passes(pause_at: str, rank: str) -> str:
    """The child's output within 3 s (it imports one small module; a paused child is killed at the timeout)."""
    env = {**os.environ, "MEGARL_PAUSE_AT": pause_at, "RANK": rank}
    try:
        return subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=3).stdout
    except subprocess.TimeoutExpired as stalled:
        return (stalled.stdout or b"").decode() + "STALLED"


def test_the_named_rank_stalls_at_its_nth_pass():
    out = passes("update_microbatch@2:rank1", "1")
    assert out.splitlines()[:2] == ["passed 1", f"[megarl] rank 1 (pid {out.split('(pid ')[1].split(')')[0]}) paused at "
                                    "update_microbatch 2 (MEGARL_PAUSE_AT=update_microbatch@2:rank1)"]
    assert out.endswith("STALLED") and "passed 2" not in out


def test_other_ranks_and_points_go_on():
    assert passes("update_microbatch@2:rank1", "0") == "passed 1\npassed 2\npassed 3\n"
    assert passes("weight_sync@1:rank0", "0") == "passed 1\npassed 2\npassed 3\n"
    assert passes("update_actor@1", "0") == "passed 1\npassed 2\npassed 3\n"  # a driver point
