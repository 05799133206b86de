"""trainer.default_local_dir is held by one run at a time; a dead holder never blocks the next run."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

HOLD = """
import sys, time
from megarl.trainer.run_lock import hold_run_dir
with hold_run_dir(sys.argv[1]):
    print("held", flush=True)
    time.sleep(600)
"""


def _holder(directory) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(directory)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_second_run_on_the_same_dir_is_refused_naming_path_pid_and_host(tmp_path):
    from megarl.trainer.run_lock import RunDirLockedError, hold_run_dir

    proc = _holder(tmp_path / "ckpt")
    try:
        with pytest.raises(RunDirLockedError) as info:
            with hold_run_dir(str(tmp_path / "ckpt")):
                pytest.fail("entered a directory another run holds")
        text = str(info.value)
        assert str(tmp_path / "ckpt") in text and f"pid {proc.pid}" in text and socket.gethostname() in text, text
        assert "trainer.default_local_dir" in text
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_holder_does_not_leave_the_dir_locked(tmp_path):
    from megarl.trainer.run_lock import hold_run_dir

    proc = _holder(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)  # a crashed run: no clean-up ran
    proc.wait()
    deadline = time.monotonic() + 10
    with hold_run_dir(str(tmp_path)):
        assert time.monotonic() < deadline


def test_the_lock_is_released_on_exit_and_reentry_by_the_same_run_is_refused(tmp_path):
    from megarl.trainer.run_lock import RunDirLockedError, hold_run_dir

    with hold_run_dir(str(tmp_path)):
        with pytest.raises(RunDirLockedError, match=f"pid {os.getpid()}"):
            with hold_run_dir(str(tmp_path)):
                pass
    with hold_run_dir(str(tmp_path)):
        pass
