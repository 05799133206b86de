"""Checkpoint directory layout, the atomic "latest" tracker, and retention.

Layout under ``trainer.default_local_dir``::

    global_step_N/actor/        actor (Megatron dist checkpoint + checksums.json, written by the workers)
    global_step_N/critic/       critic, when trained
    global_step_N/trainer.pt    controller state: step, dataloader, KL controller, RNG
    global_step_N/run_config.json   the run's resolved config (compared on resume)
    global_step_N/checksums.json    sizes + sha256 of the files above (megarl.utils.checksums)
    latest_checkpointed_iteration.txt   "N", written last (temp file + fsync + rename)

A step is written into ``global_step_N.saving`` and renamed to ``global_step_N`` only once
complete (``publish``), so a ``global_step_N`` directory is never written into: re-saving a
step that exists (after resuming from an earlier one) moves the old one to
``global_step_N.replaced`` for the instant between the two renames and deletes it after.
``recover`` undoes a crash inside that instant. A crash anywhere before the tracker is
renamed leaves the tracker pointing at the previous complete checkpoint.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

TRACKER = "latest_checkpointed_iteration.txt"
SAVING, REPLACED = ".saving", ".replaced"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")
_SIDE_DIR = re.compile(r"^global_step_(\d+)(\.saving|\.replaced)$")


def step_dir(root: str | os.PathLike, step: int) -> Path:
    return Path(root) / f"global_step_{step}"


def staging_dir(root: str | os.PathLike, step: int) -> Path:
    """Where step ``step`` is written before it is complete."""
    return Path(root) / f"global_step_{step}{SAVING}"


def _replaced_dir(root: str | os.PathLike, step: int) -> Path:
    return Path(root) / f"global_step_{step}{REPLACED}"


def publish(root: str | os.PathLike, step: int) -> Path:
    """Rename the complete ``global_step_N.saving`` to ``global_step_N`` (an existing one is
    moved aside first and deleted after). Returns the published directory."""
    final, staged, replaced = step_dir(root, step), staging_dir(root, step), _replaced_dir(root, step)
    if final.exists():
        if replaced.exists():
            shutil.rmtree(replaced)
        os.rename(final, replaced)
    os.rename(staged, final)
    _fsync_dir(Path(root))
    return final


def discard_replaced(root: str | os.PathLike, step: int) -> None:
    """Delete the old copy ``publish`` moved aside (once the tracker names the new one)."""
    shutil.rmtree(_replaced_dir(root, step), ignore_errors=True)


def recover(root: str | os.PathLike) -> None:
    """After a crash: put back a ``global_step_N.replaced`` whose new copy never arrived, and
    delete unfinished ``.saving`` and superseded ``.replaced`` directories."""
    root = Path(root)
    if not root.is_dir():
        return
    for path in sorted(root.iterdir()):
        match = _SIDE_DIR.match(path.name)
        if not match or not path.is_dir():
            continue
        final = step_dir(root, int(match.group(1)))
        if match.group(2) == REPLACED and not final.exists():
            os.rename(path, final)
        else:
            shutil.rmtree(path, ignore_errors=True)


def write_tracker(root: str | os.PathLike, step: int) -> None:
    """Atomically record ``step`` as the latest complete checkpoint under ``root``."""
    root = Path(root)
    tmp = root / f".{TRACKER}.tmp.{os.getpid()}"
    with open(tmp, "w") as handle:
        handle.write(str(int(step)))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, root / TRACKER)
    _fsync_dir(root)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_tracker(root: str | os.PathLike) -> int | None:
    """The step the tracker names, or None when there is no tracker."""
    path = Path(root) / TRACKER
    if not path.exists():
        return None
    text = path.read_text().strip()
    if not text.isdigit():
        raise ValueError(f"{path}: expected a step number, found {text!r}")
    return int(text)


def find_latest(root: str | os.PathLike) -> Path | None:
    """The checkpoint dir the tracker names (must exist), or None when nothing was saved."""
    step = read_tracker(root)
    if step is None:
        return None
    path = step_dir(root, step)
    if not path.is_dir():
        raise FileNotFoundError(f"{Path(root) / TRACKER} names step {step}, but {path} does not exist")
    return path


def step_of(path: str | os.PathLike) -> int:
    """N of a ``.../global_step_N`` path (ValueError otherwise)."""
    match = _STEP_DIR.match(Path(path).name)
    if not match:
        raise ValueError(f"{path}: a checkpoint dir must be named global_step_<N>")
    return int(match.group(1))


def saved_steps(root: str | os.PathLike) -> list[int]:
    """Steps of the ``global_step_N`` dirs under ``root``, ascending."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir())


def prune(root: str | os.PathLike, component: str, keep: int | None, protect: int | None = None) -> list[Path]:
    """Delete ``global_step_N/<component>`` of all but the newest ``keep`` checkpoints that have it
    (never the one named ``protect``); a step dir left empty is removed too. Returns the deleted paths."""
    if keep is None or keep <= 0:
        return []
    holders = [s for s in saved_steps(root) if (step_dir(root, s) / component).exists()]
    deleted = []
    for s in holders[:-keep]:
        if s == protect:
            continue
        target = step_dir(root, s) / component
        shutil.rmtree(target, ignore_errors=True)
        deleted.append(target)
        parent = step_dir(root, s)
        if not any(p.is_dir() for p in parent.iterdir()):  # no component left, only controller files
            shutil.rmtree(parent, ignore_errors=True)
    return deleted
