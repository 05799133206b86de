"""SIGTERM and Ctrl-C end the real driver after its cleanup with one line naming the phase, the step and
the last checkpoint: exit 143 (SIGTERM, whatever handler Ray installed) and 130 (Ctrl-C), no traceback,
no unfinished checkpoint and no process of the run left (issue 37 items 6 and 9)."""

from __future__ import annotations

import os
import signal

import pytest

from fault_driver import Driver, alive, describe, side_by_side

pytestmark = pytest.mark.slow

STEPS = ["trainer.total_training_steps=3", "trainer.save_freq=1"]


def _sigterm(pid: int) -> None:
    os.kill(pid, signal.SIGTERM)


def _ctrl_c(pid: int) -> None:
    os.killpg(pid, signal.SIGINT)  # the terminal sends it to the foreground process group


def _stop_at(demo_dir, run_dir, point: str, send) -> tuple[int, str, list[int]]:
    driver = Driver(demo_dir, run_dir, STEPS, env={"MEGARL_PAUSE_AT": point})
    try:
        phase, step = point.split("@")
        driver.wait_for(rf"\[megarl\] paused at {phase} of step {step}")
        pids = driver.run_pids()
        send(driver.proc.pid)
        code = driver.wait(timeout=180)  # hang guard
        return code, driver.text(), [pid for pid in pids if pid != driver.proc.pid]
    finally:
        if driver.proc.poll() is None:
            driver.kill()


def _driver_lines(text: str) -> str:
    """The driver's own output (Ray prefixes forwarded worker lines with "(WorkerHost pid=...)")."""
    return "\n".join(line for line in text.splitlines() if "pid=" not in line)


@pytest.fixture(scope="module")
def default_runs(demo_dir, tmp_path_factory) -> dict[str, tuple]:
    """The default tier's runs, side by side: SIGTERM mid-save and Ctrl-C in update_actor, each
    (exit code, output, pids of the run but the driver, run dir)."""
    sigterm, ctrl_c = tmp_path_factory.mktemp("sigterm"), tmp_path_factory.mktemp("ctrl_c")
    return dict(zip(("save_checkpoint@2", "ctrl_c"), side_by_side(
        lambda: (*_stop_at(demo_dir, sigterm, "save_checkpoint@2", _sigterm), sigterm),
        lambda: (*_stop_at(demo_dir, ctrl_c, "update_actor@2", _ctrl_c), ctrl_c))))


# SIGTERM in update_actor: extended tier. megarl's SIGTERM handling does not depend on the phase (the
# save_checkpoint case checks it, and the cleanup of the unfinished save); naming update_actor as the phase
# a signal stopped is the Ctrl-C case's check.
@pytest.mark.parametrize("point", ["save_checkpoint@2", pytest.param("update_actor@2", marks=pytest.mark.extended)])
def test_sigterm_exits_143_after_cleanup(request, demo_dir, tmp_path, point):
    if point == "save_checkpoint@2":
        code, text, pids, run_dir = request.getfixturevalue("default_runs")[point]
    else:
        (code, text, pids), run_dir = _stop_at(demo_dir, tmp_path, point, _sigterm), tmp_path
    phase = point.split("@")[0]
    assert code == 143, text[-4000:]
    lines = _driver_lines(text)
    summary = [line for line in lines.splitlines() if line.startswith("megarl: stopped by SIGTERM")]
    assert len(summary) == 1 and f"in phase {phase} at global step 2" in summary[0], lines[-3000:]
    assert str(run_dir / "ckpt" / "global_step_1") in summary[0], summary
    assert "Traceback" not in lines and "SIGTERM received" not in lines, lines[-3000:]  # Ray's native stack dump
    assert not (run_dir / "ckpt" / "global_step_2.saving").exists()  # the unfinished save was removed
    left = alive(pids, grace_s=5)  # the driver ended its Ray's processes before it exited
    assert not left, describe(left)


def test_ctrl_c_prints_one_line_instead_of_a_traceback(default_runs):
    code, text, pids, run_dir = default_runs["ctrl_c"]
    assert code == 130, text[-4000:]
    lines = _driver_lines(text)
    summary = [line for line in lines.splitlines() if line.startswith("megarl: interrupted (Ctrl-C)")]
    assert len(summary) == 1 and "in phase update_actor at global step 2" in summary[0], lines[-3000:]
    assert str(run_dir / "ckpt" / "global_step_1") in summary[0], summary
    assert "Traceback" not in lines and "KeyboardInterrupt" not in lines, lines[-3000:]
    left = alive(pids, grace_s=5)
    assert not left, describe(left)
