"""A Ray worker process killed (`kill -9`) mid-step stops the real driver: non-zero exit,
the message names the worker group, rank, pid and node with Ray's ActorDiedError report, no
hang (a generous hang guard, not a speed assertion), and no Ray process left behind."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from fault_driver import Driver, alive

pytestmark = pytest.mark.slow


def test_worker_killed_mid_step_stops_the_run_naming_it(tmp_path):
    driver = Driver(tmp_path / "demo", tmp_path / "run",
                    ["trainer.total_epochs=1000", "trainer.total_training_steps=1000", "trainer.save_freq=-1"])
    try:
        pid = int(driver.wait_for(r"\[megarl\] worker group actor_rollout_ref: rank pids \[(\d+)\]").group(1))
        driver.wait_for(r"\[megarl\] step 1/1000")  # training: the kill lands in a later step
        ray_pids = driver.ray_pids()
        assert pid in ray_pids
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        code = driver.wait(timeout=180)  # hang guard
        print(f"driver exited {time.monotonic() - killed:.1f} s after the worker was killed")
        text = driver.text()
        assert code == 7, text[-3000:]  # README: a worker failed
        assert re.search(rf"actor_rollout_ref rank 0 \(pid {pid}, on node \w+ \([\d.]+\)\): the worker process died "
                         r"during actor_rollout_ref\.", text), text[-3000:]
        assert "ActorDiedError" in text
        assert "[megarl] step 1000/1000" not in text
        assert not alive(ray_pids), f"Ray processes outlived the driver: {alive(ray_pids)}"
    finally:
        if driver.proc.poll() is None or alive(driver.ray_pids(), grace_s=0):
            driver.kill()
