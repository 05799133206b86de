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
import time

import pytest

from fault_driver import COMPARED, Driver, alive, describe, read_metrics
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


# The fault driver's text-hash reward; the call numbered `hang_at` (counted over every run, in files
# created atomically in `calls_dir`: scoring may run in several processes) never returns.
HANGING_REWARD = """
import os, time

def score(data_source, solution_str, ground_truth, extra_info, calls_dir, hang_at, scale=1.0):
    n = 1
    while True:
        try:
            os.close(os.open(os.path.join(calls_dir, str(n)), os.O_CREAT | os.O_EXCL))
            break
        except FileExistsError:
            n += 1
    if n == hang_at:
        time.sleep(10**6)
    return ((sum(map(ord, solution_str)) + int(ground_truth)) % 10) / 10.0
"""


def test_kill_of_the_driver_alone_mid_reward_leaves_nothing_and_resume_needs_no_manual_step(demo_dir, tmp_path):
    """Issue 37 item 1: `kill -9 <driver pid>` (not its process group) while a scorer is busy: no process of
    the run survives, and the same command resumes from the last checkpoint (the run lock is free)."""
    (tmp_path / "calls").mkdir()
    (tmp_path / "hang_reward.py").write_text(HANGING_REWARD)
    reward = [f"custom_reward_function.path={tmp_path / 'hang_reward.py'}", "custom_reward_function.name=score",
              f"+custom_reward_function.reward_kwargs.calls_dir={tmp_path / 'calls'}",
              "+custom_reward_function.reward_kwargs.hang_at=5", "reward.timeout=600"]  # step 2's first call (4 rows a step)
    run = tmp_path / "run"
    driver = Driver(demo_dir, run, [*STEPS, *reward])
    try:
        driver.wait_for(r"\[megarl\] step 1/3")
        deadline = time.monotonic() + 300
        while not (tmp_path / "calls" / "5").exists():
            assert driver.proc.poll() is None and time.monotonic() < deadline, driver.text()[-4000:]
            time.sleep(0.2)
        time.sleep(1.0)  # the scorer is inside the hanging call
        pids = driver.kill_driver_only()
        assert len(pids) > 3, pids  # scoring children and Ray's processes were running
        # Ray's agents notice their raylet's death at once, then spend Ray 2.60's fixed 60 s trying to
        # report it to the (dead) GCS before they exit; they hold no descriptor of the run.
        left = alive(pids, grace_s=90)
        assert not left, f"processes of the killed run survived: {describe(left)}"
    finally:
        driver.kill()
    assert read_tracker(run / "ckpt") == 1
    again = Driver(demo_dir, run, [*STEPS, *reward])
    assert again.wait() == 0, again.text()[-4000:]
    assert _resumed_from(again).endswith("global_step_1")
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]
