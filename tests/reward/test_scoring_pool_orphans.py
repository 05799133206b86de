"""A scoring child dies with the process that forked it and holds none of its descriptors.

A "driver" subprocess takes the run-directory lock, opens a log file, starts a scoring pool and
hands a call to a scorer that never returns; then it is killed with SIGKILL alone (not its
process group). Its scoring child must be gone within seconds, and the directory must be free
for the next run without any manual step.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

DRIVER = """
import os, sys, threading, time
from megarl.reward.scoring_pool import ScoringPool
from megarl.trainer.run_lock import hold_run_dir

def hang(_):
    time.sleep(10**6)

run_dir = sys.argv[1]
with hold_run_dir(run_dir):
    log = open(os.path.join(run_dir, "driver.log"), "a")
    pool = ScoringPool(hang, processes=2, timeout_s=10**6)
    pool.start()
    print("children", " ".join(str(c.process.pid) for c in pool._children), flush=True)
    threading.Thread(target=pool.run, args=([(1,), (2,)],), daemon=True).start()
    time.sleep(10**6)
"""


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _open_files(pid: int) -> list[str]:
    out = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            out.append(os.readlink(fd))
        except OSError:
            pass
    return out


def test_killed_driver_leaves_no_scorer_and_no_lock(tmp_path):
    from megarl.trainer.run_lock import hold_run_dir

    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        line = driver.stdout.readline().split()
        assert line and line[0] == "children", line
        children = [int(pid) for pid in line[1:]]
        assert len(children) == 2 and all(_running(pid) for pid in children)
        time.sleep(1.0)  # both calls handed out: the children are inside the scorer
        for pid in children:  # the child keeps stdio and its pipe, not the lock or the log
            files = _open_files(pid)
            assert not [f for f in files if f.startswith(str(tmp_path))], files
        os.kill(driver.pid, signal.SIGKILL)  # the driver alone, as `kill -9 <pid>` does
        driver.wait(timeout=30)
        deadline = time.monotonic() + 10
        while any(_running(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        survivors = [pid for pid in children if _running(pid)]
        assert not survivors, f"scoring children outlived the killed driver: {survivors}"
        with hold_run_dir(str(tmp_path)):  # the next run takes the directory: nothing holds the lock
            pass
    finally:
        try:
            os.killpg(driver.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _square(x: int) -> int:
    return x * x


def test_children_outlive_the_short_lived_threads_that_run_batches():
    """The kernel kills a child when the thread that forked it ends: a batch run from a thread that has
    finished must not take the pool's children with it."""
    import threading

    from megarl.reward.scoring_pool import ScoringPool

    pool = ScoringPool(_square, processes=2, timeout_s=30)
    try:
        for want in ([1, 4], [9, 16], [25, 36]):
            out = []
            thread = threading.Thread(target=lambda: out.extend(pool.run([(int(w ** 0.5),) for w in want])))
            thread.start()
            thread.join(timeout=60)
            assert [o.kind for o in out] == ["ok", "ok"], [(o.kind, o.error_type, o.error_text) for o in out]
            assert [o.value for o in out] == want
        pool.close()
        assert [o.value for o in pool.run([(7,)])] == [49]  # usable again after close
    finally:
        pool.close()
