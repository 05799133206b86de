"""A Ray worker process killed (`kill -9`) while the run trains stops the real driver: exit 7 (a worker
failed), the message names the worker group, rank, pid and node with Ray's ActorDiedError report, no hang
(a generous hang guard, not a speed assertion), and no Ray process left behind.

Two runs side by side (separate Ray clusters; most of a run's time is process start-up): an actor rank
killed mid-step; trainer.v1 separate_async's standalone rollout engine killed while the run trains and
generates (megarl stops the run: its weight-push group cannot continue without a member; verl 0.9.1 has
no recovery either)."""

from __future__ import annotations

import pytest

from fault_driver import assert_worker_named, killed_worker_run, side_by_side

pytestmark = pytest.mark.slow

SEPARATE = ["trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.hybrid_engine=false",
            "actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=1",
            "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl", "trainer.v1.separate_async.parameter_sync_step=2"]


@pytest.fixture(scope="module")
def killed(demo_dir, tmp_path_factory) -> dict[str, dict]:
    """worker group -> killed_worker_run's result."""
    actor, engine = tmp_path_factory.mktemp("actor_killed"), tmp_path_factory.mktemp("engine_killed")
    return dict(zip(("actor_rollout_ref", "rollout_engine"), side_by_side(
        # training: the kill lands in a later step
        lambda: killed_worker_run(demo_dir, actor, [], "actor_rollout_ref", r"\[megarl\] step 1/1000"),
        # the engine generates the next batches while the trainer trains
        lambda: killed_worker_run(demo_dir, engine, SEPARATE, "rollout_engine", r"\[megarl\] step 2/1000"))))


def test_worker_killed_mid_step_stops_the_run_naming_it(killed):
    run = killed["actor_rollout_ref"]
    assert run["code"] == 7, run["text"][-3000:]  # README: a worker failed
    assert_worker_named(run["text"], "actor_rollout_ref", run["pid"])
    assert not run["left"], f"Ray processes outlived the driver: {run['left']}"
    assert "[megarl] step 1000/1000" not in run["text"]


def test_engine_killed_stops_the_run_naming_it(killed):
    run = killed["rollout_engine"]
    assert run["code"] == 7, run["text"][-3000:]
    assert_worker_named(run["text"], "rollout_engine", run["pid"])
    assert not run["left"], f"Ray processes outlived the driver: {run['left']}"
    assert "[megarl] step 1000/1000" not in run["text"]
