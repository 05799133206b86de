"""Save / resume of a whole run: workers' model+optimizer state and the controller's state.

Order of a save (megarl.utils.checkpoint has the layout):
(1) ``begin_save``: recover from an earlier crash, create ``global_step_N.saving``;
(2) workers write ``actor/`` (and ``critic/``), each with its ``checksums.json``;
(3) the controller writes ``trainer.pt`` and ``run_config.json`` (``write_*``);
(4) ``finish_save``: the step's own ``checksums.json`` (controller files + the components'
manifests), rename to ``global_step_N`` (``publish``; an existing complete step is replaced
only now, never written into), the tracker (atomic), pruning.
A failed save is removed by ``abort_save``. A crash leaves at most a ``.saving`` directory,
which the next resume or save deletes (``recover``).

Resume (``resume_dir``) verifies a checkpoint before anything loads it: every file against
the checksums written at save (a truncated shard, a garbled ``trainer.pt``, 4 KiB of zeroed
tensor bytes, a missing ``actor/``), then that nothing in it can run code when unpickled
(``verify_components``, ``read_trainer_state``: ``torch.load(weights_only=True)``; a tampered
file is refused with ``UnsafeCheckpointError``). With ``resume_mode=auto`` a damaged newest
checkpoint is skipped with a warning naming the file and the previous complete one is used;
``resume_mode=resume_path`` fails naming the file (``CheckpointError``).
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from megarl.config.errors import ConfigError, Issue
from megarl.utils.checkpoint import (TRACKER, discard_replaced, prune, publish, read_tracker, recover, saved_steps,
                                     staging_dir, step_dir, step_of, write_tracker)
from megarl.utils.checksums import ChecksumError, digest_files, has_manifest, read_manifest, verify_manifest, write_manifest
from megarl.utils.dist_ckpt_extents import check_extents
from megarl.utils.safe_checkpoint import UnsafeCheckpointError, safe_torch_load, verify_dist_checkpoint
from megarl.utils.storage import raise_if_storage_error

__all__ = ["CheckpointError", "UnsafeCheckpointError", "abort_save", "begin_save", "finish_save", "read_run_config",
           "read_trainer_state", "resume_dir", "rng_state", "set_rng_state", "verify_checkpoint", "verify_components",
           "write_run_config", "write_trainer_state"]

TRAINER_STATE = "trainer.pt"
RUN_CONFIG = "run_config.json"
COMPONENTS = ("actor", "critic")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed. ``file``: the damaged or missing path;
    ``problem``: what is wrong with it; ``fix``: what to do."""

    def __init__(self, file: str | os.PathLike, problem: str, fix: str) -> None:
        self.file, self.problem, self.fix = str(file), problem, fix
        super().__init__(f"{file}: {problem}\n  fix: {fix}")


def rng_state() -> dict[str, Any]:
    """Python, numpy and torch CPU RNG states as tensors / plain values (safe to load)."""
    name, key, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {"name": str(name), "key": torch.from_numpy(np.asarray(key, dtype=np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    n = state["numpy"]
    if isinstance(n, tuple):  # trainer.pt written before the key was stored as a tensor
        np.random.set_state(n)
    else:
        np.random.set_state((n["name"], n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])


# ----------------------------------------------------------------------------- save
def begin_save(root: str, step: int) -> Path:
    """A fresh ``global_step_N.saving`` directory to write step ``step`` into."""
    recover(root)  # also deletes the .saving dirs of crashed saves
    path = staging_dir(root, step)
    path.mkdir(parents=True)
    return path


def write_trainer_state(path: Path, state: dict[str, Any]) -> None:
    tmp = path / f".{TRAINER_STATE}.tmp"
    try:
        torch.save(state, tmp)
    except Exception as error:  # torch reports a full disk as "[enforce fail ...] unexpected pos"
        raise_if_storage_error(error, tmp)
        raise
    os.replace(tmp, path / TRAINER_STATE)


def write_run_config(path: Path, record: dict[str, Any]) -> None:
    """The run's resolved config (megarl.trainer.resume_config.run_record), compared on resume."""
    try:
        (path / RUN_CONFIG).write_text(json.dumps(record, indent=1, sort_keys=True, default=str))
    except OSError as error:
        raise_if_storage_error(error, path / RUN_CONFIG)
        raise


def finish_save(root: str, step: int, keep: dict[str, int | None]) -> Path:
    """Checksum, publish and track the step written by ``begin_save``; prune each component
    to its ``keep`` count. Returns ``global_step_N``."""
    staged = staging_dir(root, step)
    entries = {}
    for name in (TRAINER_STATE, RUN_CONFIG):
        if (staged / name).is_file():
            entries[name] = None
    for component in sorted(p.name for p in staged.iterdir() if p.is_dir()):
        if not has_manifest(staged / component):
            raise RuntimeError(f"{staged / component}: the worker wrote no checksums.json (a megarl bug)")
        entries[f"{component}/checksums.json"] = None
    try:
        write_manifest(staged, digest_files(staged, entries))
    except OSError as error:
        raise_if_storage_error(error, staged)
        raise
    final = publish(root, step)
    write_tracker(root, step)
    discard_replaced(root, step)
    for component, count in keep.items():
        prune(root, component, count, protect=step)
    return final


def abort_save(root: str, step: int) -> None:
    """Remove the unfinished ``global_step_N.saving`` (after a failed save, once no worker writes)."""
    shutil.rmtree(staging_dir(root, step), ignore_errors=True)


# ----------------------------------------------------------------------------- load
def read_trainer_state(path: Path) -> dict[str, Any]:
    file = path / TRAINER_STATE
    if not file.exists():
        raise FileNotFoundError(f"{path} is not a complete megarl checkpoint: {TRAINER_STATE} is missing")
    return safe_torch_load(str(file), "the trainer state", str(file))


def read_run_config(path: Path) -> dict[str, Any] | None:
    """The stored ``run_config.json`` (None for checkpoints written before it existed)."""
    file = path / RUN_CONFIG
    return json.loads(file.read_text()) if file.is_file() else None


def verify_components(path: Path, components: tuple[str, ...] = COMPONENTS) -> None:
    """Check the workers' dist checkpoints under ``path`` before any worker loads them
    (megarl.utils.safe_checkpoint: nothing in them may run code when unpickled)."""
    for component in components:
        for name in ("dist_ckpt", "fsdp_dtensor"):  # DDP's, Megatron-FSDP's (megarl.workers.megatron.checkpoint)
            ckpt_dir = path / component / name
            if ckpt_dir.is_dir():
                verify_dist_checkpoint(str(ckpt_dir))


def verify_checkpoint(path: Path, components: Sequence[str]) -> None:
    """Every file of ``path`` the run will load matches the checksums written at save.

    ``components``: the worker directories this run loads (``actor``, ``critic``); one that is
    missing is damage. Raises ChecksumError naming the first bad file. A checkpoint written
    before checksums existed (no manifest anywhere) is checked for structure (megarl.utils.
    dist_ckpt_extents, its small items and ``trainer.pt`` read safely), with a warning.
    """
    if not has_manifest(path) and not any(has_manifest(path / c) for c in COMPONENTS):
        print(f"[megarl] WARNING: {path} has no checksums (written by an older megarl): only its structure is "
              "verified (files present and as long as their index says, small items readable)", flush=True)
        for name in (TRAINER_STATE, *components):
            if not (path / name).exists():
                raise ChecksumError(path / name, "missing")
        for component in components:
            check_extents(str(path / component / "dist_ckpt"))
            verify_dist_checkpoint(str(path / component / "dist_ckpt"))
        read_trainer_state(path)
        return
    needed = set(components)
    listed = read_manifest(path)
    for name in (TRAINER_STATE, *(f"{c}/checksums.json" for c in components)):
        if name not in listed:
            raise ChecksumError(path / name, "missing" if not (path / name).exists() else "not in the step's checksums.json")
    # Components this run does not load may have been pruned (max_*_ckpt_to_keep).
    verify_manifest(path, select=lambda name: "/" not in name or name.split("/", 1)[0] in needed)
    for component in components:
        verify_manifest(path / component)


def _tracker_step(root: str) -> int | None:
    try:
        return read_tracker(root)
    except ValueError as error:
        raise CheckpointError(Path(root) / TRACKER, str(error).split(": ", 1)[-1],
                              "write the step of a complete checkpoint (a global_step_N dir) into it, or "
                              "resume one with trainer.resume_mode=resume_path") from None


def _damaged(error: ChecksumError, fix: str) -> CheckpointError:
    return CheckpointError(error.file, error.problem, fix)


def resume_dir(mode: str, root: str, resume_from_path: str | None, components: Sequence[str] = ("actor",),
               below: int | None = None) -> Path | None:
    """The verified checkpoint to resume (trainer.resume_mode: auto | disable | resume_path).

    auto: the tracker's step, else the newest older complete step whose files verify (each
    skipped one is named in a warning); None when nothing was saved. ``below``: only steps before
    it (the one that failed to load). resume_path: that directory, verified. ``components``:
    worker directories the run loads.
    Raises CheckpointError (no intact checkpoint / a damaged resume_path) or ConfigError.
    """
    if mode == "disable":
        return None
    if mode == "auto":
        if not os.path.isdir(root):
            return None
        recover(root)
        latest = _tracker_step(root)
        if latest is None:
            return None
        skipped: list[CheckpointError] = []
        fix = ("restore the named files, or start over with trainer.resume_mode=disable (it overwrites this directory's "
               "checkpoints) or another trainer.default_local_dir")
        if below is not None:
            latest = min(latest, below - 1)
        elif not step_dir(root, latest).is_dir():
            skipped.append(CheckpointError(step_dir(root, latest), f"missing (named by {TRACKER})", fix))
        for step in sorted((s for s in saved_steps(root) if s <= latest), reverse=True):
            path = step_dir(root, step)
            try:
                verify_checkpoint(path, components)
            except ChecksumError as error:
                skipped.append(_damaged(error, fix))
                continue
            for bad in skipped:
                print(f"[megarl] WARNING: checkpoint {bad.file} is damaged ({bad.problem}); "
                      f"falling back to the previous complete checkpoint {path}", flush=True)
            return path
        if below is not None and not skipped:
            return None
        raise CheckpointError(root, "no intact checkpoint to resume: " + "; ".join(f"{e.file}: {e.problem}" for e in skipped), fix)
    if mode == "resume_path":
        key = "trainer.resume_from_path"
        if not resume_from_path:
            raise ConfigError([Issue(key, None, "trainer.resume_mode=resume_path needs trainer.resume_from_path",
                                     "set it to a global_step_N dir")])
        path = Path(os.path.expanduser(resume_from_path))
        try:
            step_of(path)
        except ValueError as error:
            raise ConfigError([Issue(key, resume_from_path, str(error).split(": ", 1)[-1],
                                     "point it at a global_step_<N> dir")]) from None
        if not path.is_dir():
            raise ConfigError([Issue(key, resume_from_path, "does not exist", "point it at an existing global_step_N dir")])
        try:
            verify_checkpoint(path, components)
        except ChecksumError as error:
            raise _damaged(error, f"point {key} at another global_step_N (or use trainer.resume_mode=auto, which "
                                  "falls back to the newest intact one), or restore the file") from None
        return path
    raise ConfigError([Issue("trainer.resume_mode", mode, "unknown mode", "choose auto, disable or resume_path")])
