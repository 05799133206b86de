"""`kill -9` of the real driver mid-iteration and mid-checkpoint-save; the same command
(`resume_mode=auto`) continues from the last complete checkpoint and gives the uninterrupted run's
metrics.

One run directory goes through: (1) `kill -9 <driver pid>` alone (not its process group: what a
user or the OOM killer does) in step 2 while a scorer is busy (checkpoint 1 complete): no process of
the run may survive it (issue 37 item 1); (2) resumed with no manual step (the run lock is free),
the process group killed in the middle of saving checkpoint 2 (`actor/` written into
`global_step_2.saving`, no `trainer.pt`, tracker still 1); no Ray process of it may survive; (3)
resumed to the end. Reference: 3 steps straight, alongside (2) (separate Ray clusters; most of a
run's time is process start-up): (1) alone kills sooner, so the 60 s its Ray agents take to exit
overlap the resumes instead of following them.
"""

from __future__ import annotations

import re
import time

import pytest

from fault_driver import CALL_NUMBER, COMPARED, Driver, alive, describe, read_metrics
from megarl.utils.checkpoint import read_tracker

pytestmark = pytest.mark.slow

STEPS = ["trainer.total_training_steps=3", "trainer.save_freq=1"]

# The fault driver's text-hash reward; the call numbered `hang_at` (over every run of `calls_dir`) never returns.
HANGING_REWARD = CALL_NUMBER + """
import time

def score(data_source, solution_str, ground_truth, extra_info, calls_dir, hang_at, scale=1.0):
    if call_number(calls_dir) == hang_at:
        time.sleep(10**6)
    return scale * ((sum(map(ord, solution_str)) + int(ground_truth)) % 10) / 10.0
"""


def _reward(tmp_path, calls: str, hang_at: int) -> list[str]:
    (tmp_path / calls).mkdir()
    return [f"custom_reward_function.path={tmp_path / 'hang_reward.py'}", "custom_reward_function.name=score",
            f"+custom_reward_function.reward_kwargs.calls_dir={tmp_path / calls}",
            f"+custom_reward_function.reward_kwargs.hang_at={hang_at}", "reward.timeout=600"]


def _kill_at(demo_dir, run_dir, args: list[str], point: str) -> None:
    driver = Driver(demo_dir, run_dir, args, env={"MEGARL_PAUSE_AT": point})
    phase, step = point.split("@")
    driver.wait_for(rf"\[megarl\] paused at {phase} of step {step}")
    ray_pids = driver.kill()
    assert ray_pids, "found no Ray processes of the run (the orphan check would be vacuous)"
    assert not alive(ray_pids), f"Ray processes of the killed run survived: {alive(ray_pids)}"


def _resumed_from(driver: Driver) -> str:
    match = re.search(r"\[megarl\] resumed from (\S+) \(step (\d+)\)", driver.text())
    assert match and match.group(2) == "1", driver.text()[-3000:]
    return match.group(1)


def test_kill_mid_reward_and_mid_save_then_resume(demo_dir, tmp_path):
    (tmp_path / "hang_reward.py").write_text(HANGING_REWARD)
    run = tmp_path / "run"
    args = [*STEPS, *_reward(tmp_path, "calls", hang_at=5)]  # step 2's first call (4 rows a step)
    # (1) the driver alone, mid-reward in step 2
    driver = Driver(demo_dir, run, args)
    try:
        driver.wait_for(r"\[megarl\] step 1/3")
        deadline = time.monotonic() + 300
        while not (tmp_path / "calls" / "5").exists():
            assert driver.proc.poll() is None and time.monotonic() < deadline, driver.text()[-4000:]
            time.sleep(0.2)
        time.sleep(1.0)  # the scorer is inside the hanging call
        orphans = driver.kill_driver_only()
        killed = time.monotonic()
        assert len(orphans) > 3, orphans  # scoring children and Ray's processes were running
        _resume_twice(demo_dir, tmp_path, args)
        # Nothing of the run killed in (1) survived. Ray's agents notice their raylet's death at once, then
        # spend Ray 2.60's fixed 60 s trying to report it to the (dead) GCS before they exit; they hold no
        # descriptor of the run (the resumes ran meanwhile).
        left = alive(orphans, grace_s=max(0.0, 90 - (time.monotonic() - killed)))
        assert not left, f"processes of the killed run survived: {describe(left)}"
    finally:
        driver.kill()  # whatever is left of (1) after a failure


def _resume_twice(demo_dir, tmp_path, args: list[str]) -> None:
    run, ckpt = tmp_path / "run", tmp_path / "run" / "ckpt"
    assert read_tracker(ckpt) == 1 and not (ckpt / "global_step_2").exists()
    assert [r["step"] for r in read_metrics(run)] == [1]

    # (2) the same command resumes (while the Ray agents of (1) may still be exiting), then dies
    # while checkpoint 2 is half written; the reference runs meanwhile
    reference_dir = tmp_path / "reference"
    ref = Driver(demo_dir, reference_dir, [*STEPS, *_reward(tmp_path, "reference_calls", hang_at=0)])  # never hangs
    try:
        _kill_at(demo_dir, run, args, "save_checkpoint@2")
        assert ref.wait() == 0, ref.text()[-4000:]
    finally:
        if ref.proc.poll() is None:
            ref.kill()
    want = {r["step"]: r for r in read_metrics(reference_dir)}
    assert sorted(want) == [1, 2, 3]
    assert _resumed_from_log(run).endswith("global_step_1")
    partial = ckpt / "global_step_2.saving"
    assert (partial / "actor").is_dir() and not (partial / "trainer.pt").exists()
    assert not (ckpt / "global_step_2").exists() and read_tracker(ckpt) == 1

    # (3) resume to the end: from checkpoint 1 (the partial step-2 dir is removed, step 2 saved anew)
    final = Driver(demo_dir, run, args)
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


def _resumed_from_log(run) -> str:
    """The resume point of the newest driver log in ``run``."""
    logs = sorted(run.glob("driver_*.log"), key=lambda p: int(p.stem.split("_")[1]))
    match = re.search(r"\[megarl\] resumed from (\S+) \(step (\d+)\)", logs[-1].read_text())
    assert match and match.group(2) == "1", logs[-1].read_text()[-3000:]
    return match.group(1)
