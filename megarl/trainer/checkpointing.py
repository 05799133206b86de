"""Save / resume of a whole run: workers' model+optimizer state and the controller's state.

Order of a save: (1) remove a stale partial ``global_step_N`` from an earlier crash,
(2) workers write ``actor/`` (and ``critic/``), (3) the controller writes ``trainer.pt``
(temp file + rename), (4) the tracker is rewritten atomically, (5) old checkpoints are
pruned. Resume reads only what the tracker names, so a crash before (4) resumes from the
previous complete checkpoint.

``trainer.pt`` holds only tensors and plain Python values (numpy's RNG key is stored as a
tensor) and is read with ``torch.load(weights_only=True)``; the workers' dist checkpoints are
checked the same way on the controller before a worker loads them (``verify_components``).
A tampered file cannot run code on load: it is refused with ``UnsafeCheckpointError``.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from megarl.utils.checkpoint import find_latest, prune, read_tracker, step_dir, step_of, write_tracker
from megarl.utils.safe_checkpoint import UnsafeCheckpointError, safe_torch_load, verify_dist_checkpoint

__all__ = ["UnsafeCheckpointError", "begin_save", "finish_save", "read_trainer_state", "resume_dir", "rng_state",
           "set_rng_state", "verify_components", "write_trainer_state"]

TRAINER_STATE = "trainer.pt"


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


def begin_save(root: str, step: int) -> Path:
    """The (fresh) directory for step ``step``; a leftover partial one is removed first."""
    path = step_dir(root, step)
    if path.exists() and read_tracker(root) != step:
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_trainer_state(path: Path, state: dict[str, Any]) -> None:
    tmp = path / f".{TRAINER_STATE}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path / TRAINER_STATE)


def finish_save(root: str, step: int, keep: dict[str, int | None]) -> None:
    """Mark ``step`` complete (tracker), then prune each component to its ``keep`` count."""
    write_tracker(root, step)
    for component, count in keep.items():
        prune(root, component, count, protect=step)


def read_trainer_state(path: Path) -> dict[str, Any]:
    file = path / TRAINER_STATE
    if not file.exists():
        raise FileNotFoundError(f"{path} is not a complete megarl checkpoint: {TRAINER_STATE} is missing")
    return safe_torch_load(str(file), "the trainer state", str(file))


def verify_components(path: Path, components: tuple[str, ...] = ("actor", "critic")) -> None:
    """Check the workers' dist checkpoints under ``path`` before any worker loads them
    (megarl.utils.safe_checkpoint: nothing in them may run code when unpickled)."""
    for component in components:
        ckpt_dir = path / component / "dist_ckpt"
        if ckpt_dir.is_dir():
            verify_dist_checkpoint(str(ckpt_dir))


def resume_dir(mode: str, root: str, resume_from_path: str | None) -> Path | None:
    """The checkpoint to resume (trainer.resume_mode: auto | disable | resume_path)."""
    if mode == "disable":
        return None
    if mode == "auto":
        return find_latest(root) if os.path.isdir(root) else None
    if mode == "resume_path":
        if not resume_from_path:
            raise ValueError("trainer.resume_mode=resume_path needs trainer.resume_from_path (a global_step_N dir)")
        path = Path(os.path.expanduser(resume_from_path))
        step_of(path)
        if not path.is_dir():
            raise FileNotFoundError(f"trainer.resume_from_path={resume_from_path!r} does not exist")
        return path
    raise ValueError(f"trainer.resume_mode={mode!r}: choose auto, disable or resume_path")
