"""The reward phase through the real driver (issue 37 items 2, 3 and 7), 4 rows a step:

* every call hangs: reward.phase_timeout ends the phase, the run exits 5 naming the rows still
  pending (trainer.nan_policy=stop), or scores them 0.0 and goes on, naming them (skip);
* a reward of 1e300 (finite as a float, inf in the float32 scores) exits 5 naming the row, its
  data source and the scoring function;
* dict extras: numeric keys logged as reward/<key>/mean over the rows that returned them (checked
  against the dumped responses, re-scored here), a non-numeric key named once. The skip run goes on
  to score dict extras in its steps 2 and 3 (one run for both checks).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fault_driver import CALL_NUMBER, Driver, alive, describe, read_metrics, side_by_side

pytestmark = pytest.mark.slow

REWARD_FILE = CALL_NUMBER + """
import time

def _h(solution_str, ground_truth):
    return (sum(map(ord, solution_str)) + int(ground_truth)) % 10

def hang(data_source, solution_str, ground_truth, extra_info, scale=1.0):
    time.sleep(10**6)

def huge(data_source, solution_str, ground_truth, extra_info, scale=1.0):
    return 1e300

# calls 1..hang_calls hang, the others return dict extras; with reward.num_workers=hang_calls, step 1's
# first calls hang and no other call of it starts
def hang_then_extras(data_source, solution_str, ground_truth, extra_info, calls_dir, hang_calls, scale=1.0):
    if call_number(calls_dir) <= hang_calls:
        time.sleep(10**6)
    h = _h(solution_str, ground_truth)
    out = {"score": h / 10, "acc": h >= 5, "pred": solution_str}
    if h % 2:
        out["bonus"] = float(h)
    return out
"""


@pytest.fixture(scope="module")
def demo_dir(demo_dir):
    """The session's demo assets (tests/conftest.py) with this module's reward file."""
    (demo_dir / "phase_reward.py").write_text(REWARD_FILE)
    return demo_dir


def _run(demo_dir: Path, run_dir: Path, name: str, *extra: str) -> tuple[int, str, list[int]]:
    driver = Driver(demo_dir, run_dir, [f"custom_reward_function.path={demo_dir / 'phase_reward.py'}",
                                        f"custom_reward_function.name={name}", *extra])
    try:
        driver.wait_for(r"worker group actor_rollout_ref: rank pids")
        pids = driver.run_pids()
        return driver.wait(timeout=600), driver.text(), pids
    finally:
        if driver.proc.poll() is None:
            driver.kill()


def _driver_lines(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if "pid=" not in line)


HANGING = ["reward.timeout=600", "reward.num_workers=2"]


@pytest.fixture(scope="module")
def runs(demo_dir, tmp_path_factory) -> dict[str, tuple[int, str, list[int], Path]]:
    """The module's three runs, side by side (separate Ray clusters; most of a run is start-up, and two
    wait on hanging calls): every call hangs; a score overflows float32; step 1's calls hang under
    nan_policy=skip, then dict extras. Each (exit code, output, pids of the run, run dir)."""
    hang, huge, skip = (tmp_path_factory.mktemp(name) for name in ("hang", "huge", "skip"))
    (skip / "calls").mkdir()
    return dict(zip(("hang", "huge", "skip"), side_by_side(
        lambda: (*_run(demo_dir, hang, "hang", *HANGING, "reward.phase_timeout=3", "trainer.total_training_steps=1"), hang),
        lambda: (*_run(demo_dir, huge, "huge", "trainer.total_training_steps=1"), huge),
        lambda: (*_run(demo_dir, skip, "hang_then_extras", *HANGING, "reward.phase_timeout=5", "trainer.nan_policy=skip",
                       "trainer.total_training_steps=3", f"trainer.rollout_data_dir={skip / 'rollouts'}",
                       f"+custom_reward_function.reward_kwargs.calls_dir={skip / 'calls'}",
                       "+custom_reward_function.reward_kwargs.hang_calls=2"), skip))))


def test_a_hanging_reward_ends_at_the_phase_bound_naming_the_pending_rows(runs):
    code, text, pids, _ = runs["hang"]
    lines = _driver_lines(text)
    assert code == 5, lines[-4000:]
    assert "in phase reward at global step 1" in lines and "reward.phase_timeout=3 s" in lines, lines[-4000:]
    assert re.search(r"4 of 4 rows were not scored in time: rows 0 \(megarl/arithmetic\), 1 .*, 3 ", lines), lines[-4000:]
    assert "Traceback" not in lines
    left = alive(pids, grace_s=5)  # Ray's agents would take 60 s after their raylet: the driver ends them
    assert not left, describe(left)


def test_under_nan_policy_skip_the_pending_rows_score_zero_and_are_named_then_extras_are_logged(runs):
    code, text, _, run_dir = runs["skip"]
    rollouts = run_dir / "rollouts"
    assert code == 0, _driver_lines(text)[-4000:]
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2, 3]
    step = records[0]
    assert step["reward/timeouts"] == 4.0 and step["critic/score/mean"] == 0.0
    assert "reward/acc/mean" not in step  # no row of step 1 returned extras
    warning = [line for line in text.splitlines() if "were not scored in time" in line]
    assert len(warning) == 1 and "rows 0 (megarl/arithmetic), 1 " in warning[0] and "nan_policy=skip" in warning[0]
    # steps 2 and 3: dict extras
    named = [line for line in text.splitlines() if "extra key 'pred'" in line]
    assert len(named) == 1 and "str" in named[0], named  # two steps: named once
    for record in records[1:]:
        assert record["reward/timeouts"] == 0.0
        rows = [json.loads(line) for line in (rollouts / f"{record['step']}.jsonl").read_text().splitlines()]
        h = [(sum(map(ord, r["output"])) + int(r["ground_truth"])) % 10 for r in rows]
        assert record["critic/score/mean"] == pytest.approx(sum(h) / len(h) / 10)
        assert record["reward/acc/mean"] == pytest.approx(sum(x >= 5 for x in h) / len(h))
        odd = [x for x in h if x % 2]
        if odd:
            assert record["reward/bonus/mean"] == pytest.approx(sum(odd) / len(odd))  # not diluted by the others
        else:
            assert "reward/bonus/mean" not in record
        assert "reward/pred/mean" not in record


def test_a_score_that_overflows_float32_names_row_source_and_function(demo_dir, runs):
    code, text, _, _ = runs["huge"]
    lines = _driver_lines(text)
    assert code == 5, lines[-4000:]
    problem = next(line for line in lines.splitlines() if "problem:" in line)
    for word in ("data_source='megarl/arithmetic'", f"scorer huge in {demo_dir / 'phase_reward.py'}", "1e+300",
                 "float32", "finite"):
        assert word in problem, (word, problem)
    assert "row 0 (" in problem, problem
