"""Checkpoints are never written in place, carry checksums, and a damaged one is never loaded.

The workers are replaced by file writes (as in test_checkpoint_layout.py): each component
directory gets its files and the manifest a real worker writes (megarl.utils.checksums).
The real workers' side is in tests/workers/test_checkpoint_reliability.py, the real run in
tests/fault/test_reliability_e2e.py.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

from megarl.trainer import checkpointing as ckpt
from megarl.utils.checkpoint import read_tracker, saved_steps, step_dir, write_tracker

SHARD = "actor/dist_ckpt/__0_0.distcp"


def _worker_writes(path: Path, component: str, step: int, size: int = 3 * 4096) -> None:
    """What a worker's save_checkpoint leaves: its files, then its checksum manifest."""
    from megarl.utils.checksums import write_manifest

    shards = path / component / "dist_ckpt"
    shards.mkdir(parents=True, exist_ok=True)
    (shards / "__0_0.distcp").write_bytes(bytes((step * 7 + i) % 251 for i in range(size)))
    (shards / "common.pt").write_bytes(b"common-%d" % step)
    write_manifest(path / component)


def _save(root: Path, step: int, components=("actor",), keep=None) -> Path:
    path = ckpt.begin_save(str(root), step)
    for component in components:
        _worker_writes(path, component, step)
    ckpt.write_trainer_state(path, {"global_step": step})
    ckpt.write_run_config(path, {"trainer": {"total_training_steps": 9}})
    ckpt.finish_save(str(root), step, keep or {})
    return step_dir(root, step)


def _files(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------- item 1: no in-place writes
def test_resaving_a_complete_step_never_writes_into_it(tmp_path):
    """Resumed from step 2 while step 4 is the latest complete checkpoint, the run saves step 4
    again and dies while a worker has just opened its shard (0 bytes): step 4 stays intact."""
    _save(tmp_path, 2)
    four = _save(tmp_path, 4)
    before = _files(four)
    path = ckpt.begin_save(str(tmp_path), 4)
    (path / "actor" / "dist_ckpt").mkdir(parents=True, exist_ok=True)
    open(path / SHARD, "wb").close()  # the crash: a 0-byte shard
    assert _files(four) == before
    assert read_tracker(tmp_path) == 4
    assert ckpt.resume_dir("auto", str(tmp_path), None) == four  # verified, not only named by the tracker
    assert ckpt.read_trainer_state(four)["global_step"] == 4


def test_resave_replaces_the_old_step_only_once_complete(tmp_path):
    _save(tmp_path, 2)
    four = _save(tmp_path, 4)
    old = (four / SHARD).read_bytes()
    path = ckpt.begin_save(str(tmp_path), 4)
    _worker_writes(path, "actor", 40)  # the new timeline's step 4 has other weights
    ckpt.write_trainer_state(path, {"global_step": 4, "new": 1})
    ckpt.write_run_config(path, {})
    assert (four / SHARD).read_bytes() == old  # not replaced before finish_save
    ckpt.finish_save(str(tmp_path), 4, {})
    assert (four / SHARD).read_bytes() != old and ckpt.read_trainer_state(four)["new"] == 1
    assert saved_steps(tmp_path) == [2, 4]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("global_step")) == ["global_step_2", "global_step_4"]


def test_crash_between_the_two_renames_of_a_swap_restores_the_old_step(tmp_path, monkeypatch):
    _save(tmp_path, 2)
    four = _save(tmp_path, 4)
    before = _files(four)
    path = ckpt.begin_save(str(tmp_path), 4)
    _worker_writes(path, "actor", 40)
    ckpt.write_trainer_state(path, {"global_step": 4})
    ckpt.write_run_config(path, {})
    real_rename = os.rename
    calls = []

    def rename(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:  # the old step was moved aside; the new one is not in place yet
            raise KeyboardInterrupt
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        ckpt.finish_save(str(tmp_path), 4, {})
    monkeypatch.setattr(os, "rename", real_rename)
    assert not four.exists()  # the crash window
    assert ckpt.resume_dir("auto", str(tmp_path), None) == four  # recovered before choosing
    assert _files(four) == before


def test_stale_partial_saves_are_removed_by_the_next_save(tmp_path):
    _save(tmp_path, 1)
    partial = ckpt.begin_save(str(tmp_path), 2)
    _worker_writes(partial, "actor", 2)
    assert partial.exists() and partial.name != "global_step_2"
    assert ckpt.resume_dir("auto", str(tmp_path), None) == step_dir(tmp_path, 1)
    _save(tmp_path, 2)
    assert not partial.exists() and read_tracker(tmp_path) == 2


def test_abort_save_leaves_no_partial_step_dir(tmp_path):
    _save(tmp_path, 1)
    path = ckpt.begin_save(str(tmp_path), 2)
    _worker_writes(path, "actor", 2)
    ckpt.abort_save(str(tmp_path), 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_1", "latest_checkpointed_iteration.txt"]


# ----------------------------------------------------------------------------- item 4: checksums and fallback
def _damage_truncate(step: Path) -> str:
    shard = step / SHARD
    shard.write_bytes(shard.read_bytes()[:100])
    return SHARD


def _damage_zero_page(step: Path) -> str:
    shard = step / SHARD
    data = bytearray(shard.read_bytes())
    data[4096:8192] = bytes(4096)  # silent damage: same size, 4 KiB zeroed
    shard.write_bytes(bytes(data))
    return SHARD


def _damage_trainer_state(step: Path) -> str:
    state = step / "trainer.pt"
    data = bytearray(state.read_bytes())
    data[len(data) // 2: len(data) // 2 + 64] = b"\xff" * 64
    state.write_bytes(bytes(data))
    return "trainer.pt"


def _damage_missing_actor(step: Path) -> str:
    import shutil

    shutil.rmtree(step / "actor")
    return "actor"


DAMAGE = {"truncated_shard": _damage_truncate, "zeroed_4k": _damage_zero_page, "garbled_trainer_pt": _damage_trainer_state,
          "missing_actor": _damage_missing_actor}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_newest_checkpoint_falls_back_with_a_warning_naming_the_file(tmp_path, capsys, damage):
    _save(tmp_path, 2)
    four = _save(tmp_path, 4)
    name = DAMAGE[damage](four)
    assert ckpt.resume_dir("auto", str(tmp_path), None) == step_dir(tmp_path, 2)
    out = capsys.readouterr().out
    assert "WARNING" in out and str(four / name) in out and "global_step_2" in out, out


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_checkpoint_named_by_resume_path_fails_naming_the_file(tmp_path, damage):
    _save(tmp_path, 2)
    four = _save(tmp_path, 4)
    name = DAMAGE[damage](four)
    with pytest.raises(ckpt.CheckpointError) as info:
        ckpt.resume_dir("resume_path", str(tmp_path), str(four))
    assert str(four / name) in str(info.value) and "trainer.resume_from_path" in str(info.value)


def test_no_intact_checkpoint_left_fails_listing_each(tmp_path):
    two, four = _save(tmp_path, 2), _save(tmp_path, 4)
    _damage_truncate(two), _damage_zero_page(four)
    with pytest.raises(ckpt.CheckpointError) as info:
        ckpt.resume_dir("auto", str(tmp_path), None)
    assert str(two / SHARD) in str(info.value) and str(four / SHARD) in str(info.value)
    assert "trainer.resume_mode=disable" in str(info.value)


def test_fallback_never_picks_a_step_newer_than_the_tracker(tmp_path):
    """After resuming from step 2 and saving step 3, step 4 belongs to the abandoned timeline."""
    _save(tmp_path, 2), _save(tmp_path, 4)
    three = _save(tmp_path, 3)
    assert read_tracker(tmp_path) == 3
    _damage_zero_page(three)
    assert ckpt.resume_dir("auto", str(tmp_path), None) == step_dir(tmp_path, 2)


def test_missing_critic_is_damage_when_the_run_trains_one(tmp_path):
    _save(tmp_path, 2, components=("actor", "critic"))
    four = _save(tmp_path, 4, components=("actor",))
    assert ckpt.resume_dir("auto", str(tmp_path), None, ("actor",)) == four
    assert ckpt.resume_dir("auto", str(tmp_path), None, ("actor", "critic")) == step_dir(tmp_path, 2)


def _legacy_step(root: Path, step: int) -> Path:
    """A step as megarl wrote it before checksums: a real (tiny) torch dist checkpoint, no manifest."""
    import torch.distributed.checkpoint as dcp

    path = root / f"global_step_{step}"
    dcp.save({"weight": torch.arange(4096.0) * step, "bias": torch.ones(8)},
             checkpoint_id=str(path / "actor" / "dist_ckpt"), no_dist=True)
    torch.save({"global_step": step}, path / "trainer.pt")
    write_tracker(root, step)
    return path


def test_legacy_checkpoint_without_checksums_loads_with_a_warning(tmp_path, capsys):
    """Checkpoints written before checksums existed: complete ones still resume."""
    step = _legacy_step(tmp_path, 3)
    assert ckpt.resume_dir("auto", str(tmp_path), None) == step
    assert "no checksums" in capsys.readouterr().out


def _item(step: Path, name: str):
    from megarl.utils.safe_checkpoint import read_index

    index = read_index(str(step / "actor" / "dist_ckpt" / ".metadata"))
    return next(info for where, info in index.storage_data.items() if where.fqn == name)


def _truncate(step: Path) -> Path:
    shard = step / "actor" / "dist_ckpt" / _item(step, "weight").relative_path
    shard.write_bytes(shard.read_bytes()[:-100])
    return shard


def _zero_item_start(step: Path) -> Path:
    info = _item(step, "weight")
    shard = step / "actor" / "dist_ckpt" / info.relative_path
    data = bytearray(shard.read_bytes())
    data[info.offset:info.offset + 8] = bytes(8)
    shard.write_bytes(bytes(data))
    return shard


def _garble_trainer_state(step: Path) -> Path:
    (step / "trainer.pt").write_bytes(b"\x00" * 64)
    return step / "trainer.pt"


@pytest.mark.parametrize("damage, problem", [(_truncate, "truncated"), (_zero_item_start, "item 'weight' at byte"),
                                             (_garble_trainer_state, "unreadable")])
def test_damaged_legacy_step_is_named_and_auto_falls_back(tmp_path, capsys, damage, problem):
    """Issue 37 item 5: a step without checksums is checked for structure before anything loads it."""
    older = _legacy_step(tmp_path, 2)
    newest = _legacy_step(tmp_path, 4)
    bad = damage(newest)
    assert ckpt.resume_dir("auto", str(tmp_path), None) == older
    warning = [line for line in capsys.readouterr().out.splitlines() if "falling back" in line]
    assert len(warning) == 1 and str(bad) in warning[0] and problem in warning[0] and str(older) in warning[0], warning
    with pytest.raises(ckpt.CheckpointError, match=re.escape(str(bad))):
        ckpt.resume_dir("resume_path", str(tmp_path), str(newest))


def test_garbled_tracker_names_the_file(tmp_path):
    _save(tmp_path, 2)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("\x00\x00")
    with pytest.raises(ckpt.CheckpointError, match="latest_checkpointed_iteration.txt"):
        ckpt.resume_dir("auto", str(tmp_path), None)
