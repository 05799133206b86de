"""A checkpoint that the workers fail to load falls back to the previous complete step.

Verification before start-up (checksums, or the structure of a step written before checksums
existed) catches a damaged file by name; what it cannot see (bytes zeroed inside a shard of a
step without checksums, a file the loader rejects) shows up as an error in the workers' load.
With ``trainer.resume_mode=auto`` that step is skipped like a damaged one: a warning names the
file (the first path under the step named in the worker's error, else the component's
``dist_ckpt``) and the error, and the next older complete step is loaded, verified and compared
with the config as at start-up. ``resume_path`` fails naming them (exit 4). A worker that died,
or ranks that do not all come back from the failed load (one stuck in a collective), end the run.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from megarl.trainer.checkpointing import CheckpointError
from megarl.trainer.worker_group import WorkerError, WorkerGroup
from megarl.utils.checkpoint import step_of

IDLE_TIMEOUT_S = 120.0  # every rank must answer this soon after a failed load before another one starts


def load_failure(path: Path, component: str, error: WorkerError) -> CheckpointError:
    """The failed load of ``path/component`` as a CheckpointError naming the file and the error."""
    text = "\n".join(t for t in (error.error_text, error.remote_traceback) if t)
    named = re.findall(re.escape(str(path)) + r"/[^\s'\",:)\]]+", text)
    file = named[0] if named else str(path / component / "dist_ckpt")
    lines = [line.strip() for line in (error.remote_traceback or "").splitlines() if line.strip()]
    causes = [line for line in lines if re.match(r"^[\w.]+(Error|Exception)\b", line)]  # e.g. "EOFError" at the bottom
    first = (error.error_text or "").strip().splitlines()[0] if error.error_text else ""
    problem = f"failed to load in {error.group} rank {error.rank}: {error.error_type}: {first}"
    if causes and causes[-1] not in problem:
        cause = causes[-1] if len(causes[-1]) <= 200 else causes[-1][:200] + "..."
        problem += f" (cause: {cause})"
    return CheckpointError(file, problem, "restore the named file, or resume another step with trainer.resume_mode="
                                          "resume_path, or start over with trainer.resume_mode=disable")


def load_with_fallback(path: Path, auto: bool, groups: dict[str, WorkerGroup],
                       older: Callable[[int], tuple[Path | None, Any]]) -> tuple[Path, Any | None]:
    """Load ``path`` into every group (``{component: group}``, in order); on a load error (``auto``)
    load ``older(step)``'s checkpoint instead, and so on. Returns the loaded path and, when it is not
    ``path``, the trainer state ``older`` returned for it. Raises CheckpointError when none loads."""
    state = None
    failures: list[CheckpointError] = []
    while True:
        component = None
        try:
            for component, group in groups.items():
                group.call_all("load_checkpoint", str(path / component))
            for failure in failures:
                print(f"[megarl] WARNING: checkpoint {failure.file}: {failure.problem}; falling back to the previous "
                      f"complete checkpoint {path}", flush=True)
            return path, state
        except WorkerError as error:
            if error.died or component is None:
                raise
            failure = load_failure(path, component, error)
            if not auto or not all(group.answers_within(IDLE_TIMEOUT_S) for group in groups.values()):
                raise failure from error
            failures.append(failure)
            path, state = older(step_of(path))
            if path is None:
                raise CheckpointError(failures[0].file, "no older complete checkpoint loads either: " + "; ".join(
                    f"{f.file}: {f.problem}" for f in failures), failures[0].fix) from error
