"""Run the real driver (`python -m megarl.main_ppo`) as a subprocess for fault tests.

Each run gets its own process group (so ``kill -9`` of the group takes the driver and the
Ray head processes it started: gcs, raylet, agents) and its own Ray temp dir
(``RAY_TMPDIR``), so its Ray worker processes (children of its raylet, in their own
sessions) can be found and killed by pid without touching anyone else's Ray.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]

# Deterministic tiny run (as tests/trainer/test_e2e_resume_tp.py): greedy REINFORCE++ with
# n=1, scored by a hash of the text (the random policy never solves the demo task).
REWARD_FILE = """
def text_hash_score(data_source, solution_str, ground_truth, extra_info, scale=1.0):
    return scale * ((sum(map(ord, solution_str)) + int(ground_truth)) % 10) / 10.0
"""
# For reward files: the number of a scoring call, counted over every call made with `calls_dir` (in files
# created atomically: scoring may run in several processes).
CALL_NUMBER = """
import os

def call_number(calls_dir):
    n = 1
    while True:
        try:
            os.close(os.open(os.path.join(calls_dir, str(n)), os.O_CREAT | os.O_EXCL))
            return n
        except FileExistsError:
            n += 1
"""
# The text-hash reward above, plus: the first call made with `hang_marker` (the marker file absent) never
# returns; every call raises when `fail` is set. Line 6 is the raise.
HUNG_ONCE_REWARD = """
import os, time

def score(data_source, solution_str, ground_truth, extra_info, hang_marker=None, fail=False, scale=1.0):
    if fail:
        raise KeyError("no 'answer' field in " + repr(solution_str))
    if hang_marker:
        try:  # exactly one call hangs: rows are scored in parallel (reward.num_workers), creation is the atomic test
            os.close(os.open(hang_marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            pass
        else:
            time.sleep(10**6)
    return scale * ((sum(map(ord, solution_str)) + int(ground_truth)) % 10) / 10.0
"""
COMPARED = ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/grad_norm", "actor/ppo_kl",
            "critic/advantages/max")


def overrides(demo_dir: Path, run_dir: Path, extra: list[str]) -> list[str]:
    reward = demo_dir / "hash_reward.py"
    demo_dir.mkdir(parents=True, exist_ok=True)
    if not reward.exists():
        reward.write_text(REWARD_FILE)
    return [
        "trainer.device=cpu", "ray_kwargs.ray_init.num_cpus=2", "trainer.logger=[console]",
        f"trainer.default_local_dir={run_dir}/ckpt", "trainer.val_before_train=false", "trainer.test_freq=-1",
        "data.train_batch_size=4", "data.val_batch_size=16",
        "algorithm.adv_estimator=reinforce_plus_plus", "actor_rollout_ref.rollout.n=1",
        "actor_rollout_ref.rollout.do_sample=false",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        f"custom_reward_function.path={reward}", "custom_reward_function.name=text_hash_score",
        "+custom_reward_function.reward_kwargs.scale=2.0",
        f"hydra.run.dir={run_dir}/hydra",
        *extra,
    ]


class Driver:
    """One `python -m megarl.main_ppo` process; output in ``<run_dir>/driver_<n>.log``."""

    def __init__(self, demo_dir: Path, run_dir: Path, extra: list[str], env: dict[str, str] | None = None) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        n = len(list(run_dir.glob("driver_*.log")))
        self.log = run_dir / f"driver_{n}.log"
        # short path: Ray's unix socket paths must stay under ~107 characters
        self.ray_tmp = tempfile.mkdtemp(prefix="mrf", dir="/tmp")
        full_env = {**os.environ, "MEGARL_DEMO_DIR": str(demo_dir), "RAY_TMPDIR": self.ray_tmp,
                    "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
        full_env.pop("RAY_ADDRESS", None)
        self.started = time.monotonic()
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "megarl.main_ppo", "--config-name=ppo_megatron_trainer",
                 *overrides(demo_dir, run_dir, extra)],
                cwd=run_dir, env=full_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float = 300) -> re.Match:
        """Hang guard: the first match of ``pattern`` in the output (fails if the driver exits first)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(pattern, self.text())
            if match:
                return match
            if self.proc.poll() is not None:
                self.kill()
                raise AssertionError(f"driver exited ({self.proc.returncode}) before {pattern!r}:\n{self.text()[-4000:]}")
            time.sleep(0.2)
        self.kill()
        raise AssertionError(f"no {pattern!r} within {timeout} s:\n{self.text()[-4000:]}")

    def wait(self, timeout: float = 600) -> int:
        """Hang guard: the exit code."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"driver did not exit within {timeout} s:\n{self.text()[-4000:]}") from None
        if not self.ray_pids():
            shutil.rmtree(self.ray_tmp, ignore_errors=True)
        return code

    # ------------------------------------------------------------------ processes
    def ray_pids(self) -> list[int]:
        """Processes of this run's Ray: command line naming its temp dir, and their descendants."""
        procs = _processes()
        return _with_descendants({pid for pid, (_, cmd) in procs.items() if self.ray_tmp in cmd}, procs)

    def run_pids(self) -> list[int]:
        """Every process of this run: the driver, what it started (scoring children, Ray) and their descendants."""
        procs = _processes()
        return _with_descendants({self.proc.pid} | {pid for pid, (_, cmd) in procs.items() if self.ray_tmp in cmd}, procs)

    def kill_driver_only(self) -> list[int]:
        """``kill -9`` of the driver's pid alone (what a user or the OOM killer does; no process group);
        returns the pids of the run that were alive before, for ``alive`` to check."""
        before = self.run_pids()
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)
        return [pid for pid in before if pid != self.proc.pid]

    def kill(self) -> list[int]:
        """``kill -9`` the driver's process group, then any remaining process of its Ray.
        Returns the pids of this run's Ray that were alive before the kill."""
        before = self.ray_pids()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.proc.poll() is None:
            self.proc.wait(timeout=60)
        for pid in sorted(set(before) | set(self.ray_pids())):  # workers re-parented to init are in `before`
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.ray_tmp, ignore_errors=True)
        return before


def side_by_side(*runs: Callable[[], T]) -> list[T]:
    """Call each of ``runs`` in a thread of its own, all at once; their results in order (the first error
    raised once all have ended). For independent driver runs: each has its own Ray cluster, and most of a
    run's time is process start-up, which two runs share the cores for better than one after the other."""
    with concurrent.futures.ThreadPoolExecutor(len(runs)) as pool:
        futures = [pool.submit(run) for run in runs]
    return [future.result() for future in futures]


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process."""
    procs = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        procs[int(entry.name)] = (int(stat.rsplit(")", 1)[1].split()[1]), cmd)
    return procs


def _with_descendants(roots: set[int], procs: dict[int, tuple[int, str]]) -> list[int]:
    ours, grew = set(roots), True
    while grew:
        children = {pid for pid, (ppid, _) in procs.items() if ppid in ours} - ours
        grew = bool(children)
        ours |= children
    return sorted(ours)


def describe(pids: list[int]) -> list[str]:
    """``pid: command line`` of each of ``pids`` still there."""
    procs = _processes()
    return [f"{pid}: {procs[pid][1][:300]}" for pid in pids if pid in procs]


def alive(pids: list[int], grace_s: float = 30) -> list[int]:
    """Those of ``pids`` still running after up to ``grace_s`` (zombies count as gone)."""
    deadline = time.monotonic() + grace_s
    while True:
        left = _running(pids)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def _running(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.append(pid)
    return out


def killed_worker_run(demo_dir: Path, run_dir: Path, extra: list[str], group: str, after: str) -> dict:
    """A run of (almost) endless steps; once ``after`` is printed, ``kill -9`` of rank 0 of ``group``.
    Returns the worker's ``pid``, the driver's exit ``code`` (within a hang guard of 180 s), its
    output ``text`` and the processes of its Ray still alive after a grace (``left``)."""
    driver = Driver(demo_dir, run_dir, ["trainer.total_epochs=1000", "trainer.total_training_steps=1000",
                                        "trainer.save_freq=-1", *extra])
    try:
        pid = int(driver.wait_for(rf"\[megarl\] worker group {group}: rank pids \[(\d+)\]").group(1))
        driver.wait_for(after)
        ray_pids = driver.ray_pids()
        assert pid in ray_pids
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        code = driver.wait(timeout=180)  # hang guard
        print(f"driver exited {time.monotonic() - killed:.1f} s after the worker was killed")
        # the driver ends what is left of its Ray after ray.shutdown (megarl.utils.descendants): nothing waits
        return {"pid": pid, "code": code, "text": driver.text(), "left": alive(ray_pids, grace_s=5)}
    finally:
        if driver.proc.poll() is None or alive(driver.ray_pids(), grace_s=0):
            driver.kill()


def assert_worker_named(text: str, group: str, pid: int, rank: int = 0) -> None:
    """The driver's output names the group, rank, pid and node of the dead worker, with Ray's report."""
    assert re.search(rf"{group} rank {rank} \(pid {pid}, on node \w+ \([\d.]+\)\): the worker process died "
                     rf"during {group}\.", text), text[-3000:]
    assert "ActorDiedError" in text


def read_metrics(run_dir: Path) -> list[dict]:
    """metrics.jsonl records in file order."""
    path = run_dir / "ckpt" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
