"""A Ray worker process killed (`kill -9`) mid-step stops the real driver: exit 7 (a worker failed),
the message names the worker group, rank, pid and node with Ray's ActorDiedError report, no
hang (a generous hang guard, not a speed assertion), and no Ray process left behind."""

from __future__ import annotations

import pytest

from fault_driver import Driver, alive, kill_worker_and_expect_its_name

pytestmark = pytest.mark.slow


def test_worker_killed_mid_step_stops_the_run_naming_it(demo_dir, tmp_path):
    driver = Driver(demo_dir, tmp_path / "run",
                    ["trainer.total_epochs=1000", "trainer.total_training_steps=1000", "trainer.save_freq=-1"])
    try:
        pid = int(driver.wait_for(r"\[megarl\] worker group actor_rollout_ref: rank pids \[(\d+)\]").group(1))
        driver.wait_for(r"\[megarl\] step 1/1000")  # training: the kill lands in a later step
        kill_worker_and_expect_its_name(driver, pid, "actor_rollout_ref", 7)  # README: a worker failed
        assert "[megarl] step 1000/1000" not in driver.text()
    finally:
        if driver.proc.poll() is None or alive(driver.ray_pids(), grace_s=0):
            driver.kill()
