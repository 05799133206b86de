"""Checkpoint tracker atomicity, resume choice after a crash mid-save, retention."""

import os

import pytest
import torch

from megarl.trainer import checkpointing as ckpt
from megarl.utils.checkpoint import TRACKER, find_latest, prune, read_tracker, saved_steps, staging_dir, step_dir, write_tracker
from megarl.utils.checksums import write_manifest


def _save(root, step, keep=None, crash_after=None):
    """What RayPPOTrainer.save_checkpoint does, with the workers replaced by file writes.
    crash_after: 'actor' | 'critic' | 'trainer' raises right after that part is written."""
    path = ckpt.begin_save(str(root), step)
    (path / "actor").mkdir()
    (path / "actor" / "weights.bin").write_bytes(b"a" * 16)
    write_manifest(path / "actor")
    if crash_after == "actor":
        raise KeyboardInterrupt
    (path / "critic").mkdir()
    (path / "critic" / "weights.bin").write_bytes(b"c" * 16)
    write_manifest(path / "critic")
    if crash_after == "critic":
        raise KeyboardInterrupt
    ckpt.write_trainer_state(path, {"global_step": step})
    if crash_after == "trainer":
        raise KeyboardInterrupt
    ckpt.finish_save(str(root), step, keep or {})


@pytest.mark.parametrize("crash_after", ["actor", "critic", "trainer"])
def test_crash_mid_save_resumes_previous_complete(tmp_path, crash_after):
    _save(tmp_path, 2)
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, 4, crash_after=crash_after)
    assert staging_dir(tmp_path, 4).exists() and not step_dir(tmp_path, 4).exists()  # the partial dir is aside...
    assert find_latest(tmp_path) == step_dir(tmp_path, 2)  # ...and resume picks step 2
    assert ckpt.resume_dir("auto", str(tmp_path), None) == step_dir(tmp_path, 2)
    assert not staging_dir(tmp_path, 4).exists()  # resuming cleans it up
    assert ckpt.read_trainer_state(step_dir(tmp_path, 2))["global_step"] == 2
    # Saving step 4 again never mixes with a partial dir left by a crash.
    staging_dir(tmp_path, 4).mkdir()
    (staging_dir(tmp_path, 4) / "stale.txt").write_text("partial")
    _save(tmp_path, 4)
    assert not (tmp_path / "global_step_4" / "stale.txt").exists() and not staging_dir(tmp_path, 4).exists()
    assert read_tracker(tmp_path) == 4


def test_tracker_is_replaced_atomically(tmp_path, monkeypatch):
    write_tracker(tmp_path, 3)

    def fail_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail_replace)
    with pytest.raises(OSError):
        write_tracker(tmp_path, 5)
    assert (tmp_path / TRACKER).read_text() == "3"


def test_max_to_keep_per_component(tmp_path):
    for step in (1, 2, 3, 4):
        _save(tmp_path, step, keep={"actor": 2, "critic": 3})
    assert saved_steps(tmp_path) == [2, 3, 4]  # step 1 lost both parts: dir removed
    assert [s for s in saved_steps(tmp_path) if (step_dir(tmp_path, s) / "actor").exists()] == [3, 4]
    assert [s for s in saved_steps(tmp_path) if (step_dir(tmp_path, s) / "critic").exists()] == [2, 3, 4]
    assert prune(tmp_path, "actor", None) == []


def test_resume_modes(tmp_path):
    assert ckpt.resume_dir("auto", str(tmp_path / "none"), None) is None
    _save(tmp_path, 7)
    assert ckpt.resume_dir("disable", str(tmp_path), None) is None
    assert ckpt.resume_dir("resume_path", str(tmp_path), str(tmp_path / "global_step_7")) == tmp_path / "global_step_7"
    with pytest.raises(ValueError, match="resume_from_path"):
        ckpt.resume_dir("resume_path", str(tmp_path), None)
    with pytest.raises(ValueError, match="global_step_<N>"):
        ckpt.resume_dir("resume_path", str(tmp_path), str(tmp_path))
    (tmp_path / TRACKER).write_text("9")
    with pytest.raises(FileNotFoundError, match="step 9"):
        find_latest(tmp_path)


def test_rng_state_round_trip():
    state = ckpt.rng_state()
    a = torch.rand(3)
    ckpt.set_rng_state(state)
    assert torch.equal(torch.rand(3), a)
