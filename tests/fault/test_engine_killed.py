"""trainer.v1 separate_async: a standalone rollout engine killed (`kill -9`) while the run trains and
generates stops the real driver within a bounded time, naming the engine (worker group
rollout_engine, rank, pid, node, Ray's ActorDiedError report), and leaves no Ray process behind.
megarl stops the run: its weight-push group cannot continue without a member (verl 0.9.1 has no
recovery either)."""

from __future__ import annotations

import pytest

from fault_driver import Driver, alive, kill_worker_and_expect_its_name

pytestmark = pytest.mark.slow

SEPARATE = ["trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.hybrid_engine=false",
            "actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=1",
            "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl", "trainer.v1.separate_async.parameter_sync_step=2"]


def test_engine_killed_stops_the_run_naming_it(demo_dir, tmp_path):
    driver = Driver(demo_dir, tmp_path / "run",
                    ["trainer.total_epochs=1000", "trainer.total_training_steps=1000", "trainer.save_freq=-1", *SEPARATE])
    try:
        pid = int(driver.wait_for(r"\[megarl\] worker group rollout_engine: rank pids \[(\d+)\]").group(1))
        driver.wait_for(r"\[megarl\] step 2/1000")  # the engine generates the next batches while the trainer trains
        kill_worker_and_expect_its_name(driver, pid, "rollout_engine", 7)  # README: a worker failed
        assert "[megarl] step 1000/1000" not in driver.text()
    finally:
        if driver.proc.poll() is None or alive(driver.ray_pids(), grace_s=0):
            driver.kill()
