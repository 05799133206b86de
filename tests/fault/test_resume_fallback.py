"""A step that fails to load falls back to the previous complete step, naming the file and the error,
whether or not it has checksums (issue 37 item 5).

One run saves steps 2 and 4; copies of its directory lose their checksums (as written by an older
megarl), then step 4 is damaged: (1) a shard truncated: found before Ray starts, by the checkpoint
index's extents; (2) bytes inside a tensor item's header zeroed, which only the workers' load finds.
Each resume with trainer.resume_mode=auto warns naming the file, resumes step 2 and reproduces the
uninterrupted run's steps 3 and 4.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from fault_driver import COMPARED, Driver, read_metrics, side_by_side

pytestmark = pytest.mark.slow

STEPS = ["trainer.total_training_steps=4", "trainer.save_freq=2"]
RAY_STARTED = "Started a local Ray instance"


@pytest.fixture(scope="module")
def saved(four_steps) -> Path:
    """The run that saved steps 2 and 4 (tests/fault/conftest.py; its step 1 had a timed-out scoring call,
    which does not change what a resume from step 2 must reproduce; the resumes here score with the fault
    driver's text-hash reward, the same function)."""
    return four_steps


def _without_checksums(saved: Path, run: Path) -> Path:
    """A copy of the saved run whose checkpoints have no checksums.json; returns step 4's actor dist_ckpt."""
    shutil.copytree(saved / "ckpt", run / "ckpt")
    for manifest in (run / "ckpt").rglob("checksums.json"):
        manifest.unlink()
    (run / "ckpt" / "metrics.jsonl").write_text("".join(line for line in (saved / "ckpt" / "metrics.jsonl").read_text()
                                                        .splitlines(keepends=True) if '"step": 1' in line or '"step": 2' in line))
    return run / "ckpt" / "global_step_4" / "actor" / "dist_ckpt"


def _resume_and_compare(demo_dir, saved: Path, run: Path) -> tuple[str, str]:
    """Resume ``run`` to step 4; returns (the fallback warning, the whole output)."""
    driver = Driver(demo_dir, run, STEPS)
    assert driver.wait() == 0, driver.text()[-4000:]
    text = driver.text()
    warning = next((line for line in text.splitlines() if "WARNING" in line and "falling back" in line), None)
    assert warning is not None and "global_step_2" in warning, text[-4000:]
    assert re.search(r"\[megarl\] resumed from \S+global_step_2 \(step 2\)", text), text[-4000:]
    want = {r["step"]: r for r in read_metrics(saved)}
    got = {r["step"]: r for r in read_metrics(run)}
    for step in (3, 4):
        for key in COMPARED:
            assert got[step][key] == pytest.approx(want[step][key], rel=1e-4, abs=1e-6), f"step {step} {key}"
    return warning, text


def _truncate_a_shard(ckpt_dir: Path) -> Path:
    shard = sorted(ckpt_dir.glob("*.distcp"))[-1]
    with open(shard, "r+b") as handle:
        handle.truncate(shard.stat().st_size // 2)
    return shard


def _zero_a_tensor_header(ckpt_dir: Path) -> Path:
    """Bytes inside the first tensor item's header (after its first bytes): only loading it fails."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from megarl.utils.safe_checkpoint import read_index

    index = read_index(str(ckpt_dir / ".metadata"))
    tensors = {fqn for fqn, item in index.state_dict_metadata.items() if isinstance(item, TensorStorageMetadata)}
    where, info = next((i, s) for i, s in sorted(index.storage_data.items(), key=lambda kv: kv[1].offset)
                       if i.fqn in tensors and "_extra_state" not in i.fqn)
    with open(ckpt_dir / info.relative_path, "r+b") as handle:
        handle.seek(int(info.offset) + 16)
        handle.write(bytes(48))
    return ckpt_dir


@pytest.fixture(scope="module")
def resumed(demo_dir, saved, tmp_path_factory) -> dict[str, tuple[Path, str, str]]:
    """Both damaged copies resumed side by side: damage -> (the damaged path, the fallback warning, the output)."""
    runs = {damage: tmp_path_factory.mktemp(damage) for damage in ("truncated", "unloadable")}
    damaged = {"truncated": _truncate_a_shard(_without_checksums(saved, runs["truncated"])),
               "unloadable": _zero_a_tensor_header(_without_checksums(saved, runs["unloadable"]))}
    results = side_by_side(*(lambda run=run: _resume_and_compare(demo_dir, saved, run) for run in runs.values()))
    return {damage: (damaged[damage], *result) for damage, result in zip(runs, results)}


def test_a_truncated_shard_without_checksums_is_named_before_ray(resumed):
    shard, warning, text = resumed["truncated"]
    assert str(shard) in warning and "truncated" in warning, warning
    assert text.index(warning) < text.index(RAY_STARTED)  # decided before any worker started


def test_a_shard_the_workers_cannot_load_falls_back_naming_it_and_the_error(resumed):
    ckpt_dir, warning, text = resumed["unloadable"]
    assert str(ckpt_dir) in warning and "failed to load in actor_rollout_ref rank 0" in warning, warning
    assert re.search(r"cause: [\w.]+(Error|Exception)", warning), warning
    assert text.index(RAY_STARTED) < text.index(warning)  # the workers found it, not the verification
