"""`kill -9` of the real driver mid-iteration and mid-checkpoint-save; `resume_mode=auto`
continues from the last complete checkpoint and gives the uninterrupted run's metrics.

One run directory goes through: (1) killed in step 2 before the actor update (checkpoint 1
complete), (2) resumed, killed in the middle of saving checkpoint 2 (`actor/` written into
`global_step_2.saving`, no `trainer.pt`, tracker still 1), (3) resumed to the end.
Reference: 3 steps straight.
No Ray process of a killed run may survive it.
"""

from __future__ import annotations

import re

import pytest

from fault_driver import COMPARED, Driver, alive, read_metrics
from megarl.utils.checkpoint import read_tracker

pytestmark = pytest.mark.slow

STEPS = ["trainer.total_training_steps=3", "trainer.save_freq=1"]


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("demo")


def _kill_at(demo_dir, run_dir, point: str) -> None:
    driver = Driver(demo_dir, run_dir, STEPS, env={"MEGARL_PAUSE_AT": point})
    phase, step = point.split("@")
    driver.wait_for(rf"\[megarl\] paused at {phase} of step {step}")
    ray_pids = driver.kill()
    assert ray_pids, "found no Ray processes of the run (the orphan check would be vacuous)"
    assert not alive(ray_pids), f"Ray processes of the killed run survived: {alive(ray_pids)}"


def _resumed_from(driver: Driver) -> str:
    match = re.search(r"\[megarl\] resumed from (\S+) \(step (\d+)\)", driver.text())
    assert match, driver.text()[-3000:]
    return match.group(1)


def test_kill_mid_iteration_and_mid_save_then_resume(demo_dir, tmp_path):
    # The demo assets are built once, then the reference runs alongside the first killed run
    # (separate Ray clusters; most of a run's time is process start-up).
    reference_dir = tmp_path / "reference"
    run = tmp_path / "run"
    ckpt = run / "ckpt"
    ref = Driver(demo_dir, reference_dir, STEPS)
    try:
        ref.wait_for(r"default_local_dir: ")  # config printed: the demo assets are built
        # (1) mid-iteration: step 1 checkpointed, step 2 generated and scored, actor not updated
        _kill_at(demo_dir, run, "update_actor@2")
        assert ref.wait() == 0, ref.text()[-4000:]
    finally:
        if ref.proc.poll() is None:
            ref.kill()
    want = {r["step"]: r for r in read_metrics(reference_dir)}
    assert sorted(want) == [1, 2, 3]
    assert read_tracker(ckpt) == 1 and not (ckpt / "global_step_2").exists()
    assert [r["step"] for r in read_metrics(run)] == [1]

    # (2) resume, then die while checkpoint 2 is half written
    _kill_at(demo_dir, run, "save_checkpoint@2")
    assert _resumed_from_log(run, 1).endswith("global_step_1")
    partial = ckpt / "global_step_2.saving"
    assert (partial / "actor").is_dir() and not (partial / "trainer.pt").exists()
    assert not (ckpt / "global_step_2").exists() and read_tracker(ckpt) == 1

    # (3) resume to the end: from checkpoint 1 (the partial step-2 dir is removed, step 2 saved anew)
    final = Driver(demo_dir, run, STEPS)
    assert final.wait() == 0, final.text()[-4000:]
    assert _resumed_from(final).endswith("global_step_1")
    assert read_tracker(ckpt) == 3 and (ckpt / "global_step_2" / "trainer.pt").exists() and not partial.exists()
    got = read_metrics(run)
    assert [r["step"] for r in got] == [1, 2, 3]  # each step logged once: the killed attempts logged nothing
    got = {r["step"]: r for r in got}
    assert want[2]["actor/grad_norm"] != pytest.approx(want[3]["actor/grad_norm"])  # the steps differ at all
    for step in (1, 2, 3):
        for key in COMPARED:
            assert got[step][key] == pytest.approx(want[step][key], rel=1e-4, abs=1e-6), f"step {step} {key}"


def _resumed_from_log(run, step: int) -> str:
    """The resume line of the newest driver log in ``run``."""
    logs = sorted(run.glob("driver_*.log"), key=lambda p: int(p.stem.split("_")[1]))
    match = re.search(r"\[megarl\] resumed from (\S+) \(step (\d+)\)", logs[-1].read_text())
    assert match and int(match.group(2)) == step, logs[-1].read_text()[-3000:]
    return match.group(1)
