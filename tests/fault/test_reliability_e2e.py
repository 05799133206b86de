"""Issue 15 end to end: the real driver (`python -m megarl.main_ppo`), one run directory
taken through the failures in order.

1. 4 steps, checkpoints 2 and 4; the first scoring call hangs: reward.timeout cuts it, the
   sample scores 0, reward/timeouts counts it, one warning shows it (the run is tests/fault/conftest.py's
   four_steps, which resume_fallback starts from too; copied here).
2. resume_path=global_step_2, killed while step 4 is saved again: the complete step 4 is
   untouched (the new one was written aside).
3. 4 KiB of a step-4 shard zeroed: resume_path to it exits 4 naming the file (before Ray);
   another model.path exits 2 naming the key (before Ray); the directory locked by another
   process exits 3 naming pid and host (before Ray).
4. resume_mode=auto falls back to step 2 with a warning naming the file, and applies a new
   actor lr from step 3 on, saying so.
Separately: a reward function that raises during validation exits 5 naming the phase and
the sample, its traceback in the log file; a checkpoint on a full disk (a 1 MiB tmpfs,
needs root to mount) exits 6 naming the mount and leaves no partial step directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from fault_driver import HUNG_ONCE_REWARD, Driver, read_metrics

pytestmark = pytest.mark.slow

NO_RAY = "Started a local Ray instance"


@pytest.fixture(scope="module", autouse=True)
def reward_file(demo_dir) -> None:
    """The reward file of these runs, in the session's demo dir (four_steps writes it too)."""
    (demo_dir / "hung_once_reward.py").write_text(HUNG_ONCE_REWARD)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("run")


def _args(demo_dir, *extra, **kwargs):
    reward = [f"custom_reward_function.path={demo_dir / 'hung_once_reward.py'}", "custom_reward_function.name=score"]
    reward += [f"+custom_reward_function.reward_kwargs.{k}={v}" for k, v in kwargs.items()]
    return [*reward, *extra]


def _demo_settings(demo_dir) -> list[str]:
    """The demo profile as explicit overrides: with a model path given, the profile no longer applies."""
    from omegaconf import OmegaConf

    from megarl.config.demo_profile import DEMO_PROFILE

    def cli(v):
        return "null" if v is None else str(v).lower() if isinstance(v, bool) else "[" + ",".join(map(cli, v)) + "]" if isinstance(v, list) else str(v)

    profile = OmegaConf.to_container(OmegaConf.load(DEMO_PROFILE), resolve=False)
    driver = ("model.path", "_files", "rollout.n", "adv_estimator", "train_batch_size", "ppo_mini_batch_size",
              "ppo_micro_batch_size_per_gpu", "test_freq", "val_before_train", "logger")  # the driver sets these
    out = [f"{k}={cli(v)}" for k, v in profile.items() if not k.endswith(driver)]
    return out + [f"data.train_files={demo_dir / 'train.parquet'}", f"data.val_files={demo_dir / 'val.parquet'}"]


def _run(demo_dir, run_dir, *extra, env=None, timeout=900, **kwargs) -> tuple[int, str]:
    driver = Driver(demo_dir, run_dir, _args(demo_dir, *extra, **kwargs), env=env)
    code = driver.wait(timeout=timeout)
    return code, driver.text()


def _digests(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.rglob("*")) if p.is_file()}


def _assert_one_message(text: str, code: int, want_code: int) -> None:
    """Exit code and no traceback from the driver (Ray forwards worker logs as "(WorkerHost pid=...)" lines:
    vLLM logs a harmless traceback at start-up)."""
    assert code == want_code, text[-4000:]
    driver = "\n".join(line for line in text.splitlines() if "pid=" not in line)
    assert "Traceback" not in driver and "HYDRA_FULL_ERROR" not in driver, driver[-4000:]


@pytest.fixture(scope="module")
def first_run(four_steps, run_dir) -> str:
    """Step 1's run (tests/fault/conftest.py: resume_fallback starts from it too), copied into this
    module's run directory; its output."""
    shutil.copytree(four_steps, run_dir, dirs_exist_ok=True)
    return (run_dir / "driver_0.log").read_text()


def test_1_a_hung_reward_call_is_cut_and_counted(first_run, run_dir):
    metrics = {r["step"]: r for r in read_metrics(run_dir)}
    assert [metrics[s]["reward/timeouts"] for s in (1, 2, 3, 4)] == [1.0, 0.0, 0.0, 0.0]
    warnings = [line for line in first_run.splitlines() if "reward.timeout" in line]
    assert len(warnings) == 1 and "step 1" in warnings[0] and "training" in warnings[0] and "0.0" in warnings[0], warnings
    ckpt = run_dir / "ckpt"
    assert (ckpt / "global_step_2" / "checksums.json").is_file() and (ckpt / "global_step_4" / "actor" / "checksums.json").is_file()


def test_2_resaving_a_complete_step_after_resume_path_never_touches_it(first_run, demo_dir, run_dir):
    from megarl.trainer import checkpointing as ckpt

    root = run_dir / "ckpt"
    four = root / "global_step_4"
    before = _digests(four)
    driver = Driver(demo_dir, run_dir, _args(demo_dir, "trainer.total_training_steps=4", "trainer.save_freq=2",
                                             "trainer.resume_mode=resume_path", f"trainer.resume_from_path={root / 'global_step_2'}"),
                    env={"MEGARL_PAUSE_AT": "save_checkpoint@4"})
    try:
        driver.wait_for(r"\[megarl\] paused at save_checkpoint of step 4")
    finally:
        driver.kill()
    assert (root / "global_step_4.saving" / "actor").is_dir()  # the new step 4, written aside
    assert _digests(four) == before
    assert ckpt.resume_dir("auto", str(root), None) == four  # complete and verified


def _zero_4k_of_a_shard(four: Path) -> Path:
    shard = sorted((four / "actor" / "dist_ckpt").glob("*.distcp"))[0]
    data = bytearray(shard.read_bytes())
    data[4096:8192] = bytes(4096)
    shard.write_bytes(bytes(data))
    return shard


def test_3_damage_lock_and_model_changes_fail_before_ray(first_run, demo_dir, run_dir):
    from megarl.trainer.run_lock import hold_run_dir

    root = run_dir / "ckpt"
    shard = _zero_4k_of_a_shard(root / "global_step_4")
    other_model = run_dir / "other_model"
    shutil.copytree(demo_dir / "model", other_model)
    # one after the other: both are refused while the trainer reads the checkpoint, which it does holding the run
    # lock (side by side, the second found the first's lock: exit 3, CI 2026-11-27)
    damaged = Driver(demo_dir, run_dir, _args(demo_dir, "trainer.resume_mode=resume_path",
                                              f"trainer.resume_from_path={root / 'global_step_4'}"))
    code, text = damaged.wait(timeout=900), damaged.text()
    _assert_one_message(text, code, 4)
    assert str(shard) in text and NO_RAY not in text, text[-4000:]

    changed = Driver(demo_dir, run_dir, _args(demo_dir, f"actor_rollout_ref.model.path={other_model}", *_demo_settings(demo_dir)))
    code, text = changed.wait(timeout=900), changed.text()
    _assert_one_message(text, code, 2)
    assert "actor_rollout_ref.model.path" in text and str(other_model) in text and str(demo_dir / "model") in text, text[-4000:]
    assert NO_RAY not in text

    metrics_before = (root / "metrics.jsonl").read_bytes()
    with hold_run_dir(str(root)):
        code, text = _run(demo_dir, run_dir)
    _assert_one_message(text, code, 3)
    assert str(root) in text and f"pid {os.getpid()}" in text and os.uname().nodename in text and NO_RAY not in text, text[-4000:]
    assert (root / "metrics.jsonl").read_bytes() == metrics_before


def test_4_auto_resume_falls_back_and_applies_the_new_lr(first_run, demo_dir, run_dir):
    from omegaconf import OmegaConf

    from megarl.config.demo_profile import DEMO_PROFILE

    root = run_dir / "ckpt"
    shard = sorted((root / "global_step_4" / "actor" / "dist_ckpt").glob("*.distcp"))[0]
    code, text = _run(demo_dir, run_dir, "trainer.total_training_steps=5", "trainer.save_freq=2",
                      "actor_rollout_ref.actor.optim.lr=0.01")
    assert code == 0, text[-4000:]
    warning = next(line for line in text.splitlines() if "WARNING" in line and str(shard) in line)
    assert "global_step_2" in warning
    assert re.search(r"\[megarl\] resumed from \S+global_step_2 \(step 2\)", text), text[-4000:]
    demo_lr = OmegaConf.load(DEMO_PROFILE)["actor_rollout_ref.actor.optim.lr"]
    assert re.search(rf"actor_rollout_ref\.actor\.optim\.lr: {re.escape(str(demo_lr))} -> 0\.01: applied", text), text[-4000:]
    records = read_metrics(run_dir)
    lrs = {r["step"]: r["actor/lr"] for r in records}
    assert lrs[3] == pytest.approx(0.01) and lrs[5] == pytest.approx(0.01)
    assert not (root / "global_step_4.saving").exists() and (root / "global_step_5" / "checksums.json").is_file()


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True).returncode == 0


@pytest.fixture(scope="module", autouse=True)
def stopped_runs(reward_file, demo_dir, tmp_path_factory) -> Iterator[dict[str, Future | None]]:
    """The runs that stop in their first step, started with the module and read by the last tests, so that
    they run alongside its other runs (their own run dirs and Ray clusters; most of a run is start-up): a
    reward that raises in validation; a checkpoint on a full disk (a 1 MiB tmpfs: None where it cannot be
    mounted, which needs root). Each a future of (run dir, exit code, output)."""
    failing, full = tmp_path_factory.mktemp("failing_reward"), tmp_path_factory.mktemp("disk_full")
    runs = {"failing_reward": lambda: (failing, *_run(demo_dir, failing, "trainer.val_before_train=true",
                                                      "trainer.total_training_steps=1", fail=True))}
    mounted = _mount_tmpfs(full / "ckpt", "1m")
    if mounted:
        runs["disk_full"] = lambda: (full, *_run(demo_dir, full, "trainer.total_training_steps=1", "trainer.save_freq=1"))
    try:
        with ThreadPoolExecutor(len(runs)) as pool:
            yield {"disk_full": None} | {name: pool.submit(run) for name, run in runs.items()}
    finally:
        if mounted:
            subprocess.run(["umount", str(full / "ckpt")], check=False)


def test_reward_exception_in_validation_is_one_message_with_the_sample(stopped_runs):
    _, code, text = stopped_runs["failing_reward"].result()
    _assert_one_message(text, code, 5)
    for word in ("validation", "step 0", "row 0", "prompt=", "ground_truth=", "KeyError", "fix:"):
        assert word in text, (word, text[-4000:])
    log = re.search(r"full traceback: (\S+)", text).group(1)
    assert 'hung_once_reward.py", line 6, in score' in Path(log).read_text()


def test_disk_full_during_save_is_named_and_leaves_no_partial_step(stopped_runs):
    if stopped_runs["disk_full"] is None:
        pytest.skip("needs root to mount a 1 MiB tmpfs")
    run_dir, code, text = stopped_runs["disk_full"].result()
    ckpt = run_dir / "ckpt"
    _assert_one_message(text, code, 6)
    assert f"no space left on {ckpt}" in text and "save_checkpoint" in text and "global step 1" in text, text[-4000:]
    assert not [p.name for p in ckpt.iterdir() if p.name.startswith("global_step")], list(ckpt.iterdir())
    log = re.search(r"full traceback: (\S+)", text).group(1)
    assert "Traceback" in Path(log).read_text()
