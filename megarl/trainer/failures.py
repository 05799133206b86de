"""A failed run, told like a config error: one message, a documented exit code, a log file.

``explain(error, context)`` turns whatever stopped the run into a ``RunFailure``: the exit
code, the phase and global step it happened in (``FailureContext``, kept by the trainer),
which worker (group, rank, pid) or file, the problem in one line, the fix, and the path of
a log file holding every traceback (the controller's, the worker's, the reward function's).
``python -m megarl.main_ppo`` prints ``RunFailure.message()`` on stderr and exits with
``RunFailure.code``:

    1  internal error (a megarl bug or something unforeseen; the log has the traceback)
    2  bad config or data (before start; or found by the trainer, e.g. a resume refused)
    3  trainer.default_local_dir is in use by another run
    4  the checkpoint to resume is damaged, missing or unsafe
    5  the reward function failed (raised, returned a non-number / NaN)
    6  no space left (or another write failure) saving a checkpoint, metrics or logs
    7  a worker failed: raised (e.g. NaN/Inf with trainer.nan_policy=stop), died or hung
  130  interrupted by Ctrl-C (SIGINT), after the cleanup
  143  stopped by SIGTERM (scancel, a time limit, kill), after the cleanup

``interrupted(code, context)`` is the one line printed for the last two.
"""

from __future__ import annotations

import errno
import os
import tempfile
import time
import traceback
from dataclasses import dataclass

EXIT_INTERNAL, EXIT_CONFIG, EXIT_LOCKED, EXIT_CHECKPOINT, EXIT_REWARD, EXIT_STORAGE, EXIT_WORKER = 1, 2, 3, 4, 5, 6, 7
EXIT_INTERRUPTED = 130  # 128 + SIGINT; SIGTERM's 143 is megarl.utils.signals.EXIT_SIGTERM
_MAX_PROBLEM_LINES = 6


@dataclass
class FailureContext:
    """Where the run was: ``phase`` (the trainer's current phase: init_workers, load_checkpoint,
    generate, reward, update_actor, save_checkpoint, validate, ...), ``step`` (global step),
    ``run_dir`` (trainer.default_local_dir: logs go to ``<run_dir>/logs``), ``latest`` (the
    latest complete checkpoint, for the fix)."""

    phase: str | None = None
    step: int | None = None
    run_dir: str | None = None
    latest: str | None = None


@dataclass
class RunFailure:
    code: int
    problem: str
    fix: str
    phase: str | None = None
    step: int | None = None
    where: str | None = None
    log_file: str | None = None
    plain: bool = False  # a config / data error: printed as "megarl: <problem>" like before start-up

    def message(self) -> str:
        if self.plain:
            return f"megarl: {self.problem}" + (f"\n  full traceback: {self.log_file}" if self.log_file else "")
        at = "" if self.phase is None else f" in phase {self.phase}"
        at += "" if self.step is None else f" at global step {self.step}"
        lines = [f"megarl: the run failed{at} (exit code {self.code})"]
        if self.where:
            lines.append(f"  where: {self.where}")
        lines.append(f"  problem: {self.problem}")
        lines.append(f"  fix: {self.fix}")
        if self.log_file:
            lines.append(f"  full traceback: {self.log_file}")
        return "\n".join(lines)


def _first_lines(text: str) -> str:
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    more = f" [... {len(lines) - _MAX_PROBLEM_LINES} more lines in the log]" if len(lines) > _MAX_PROBLEM_LINES else ""
    return "\n    ".join(lines[:_MAX_PROBLEM_LINES]) + more


def _resume_hint(context: FailureContext) -> str:
    latest = context.latest or "none yet"
    return f"run the same command again: trainer.resume_mode=auto continues from the latest complete checkpoint ({latest})"


def _storage_fix(problem: str, context: FailureContext) -> str:
    return ("free space there, or point trainer.default_local_dir at a larger disk; the unfinished checkpoint was removed "
            f"(no partial global_step_N is left); then {_resume_hint(context)}")


def _classify(error: BaseException, context: FailureContext) -> RunFailure:
    from megarl.config.errors import ConfigError
    from megarl.data import DataError
    from megarl.reward import RewardError, RewardFunctionError
    from megarl.trainer.checkpointing import CheckpointError, UnsafeCheckpointError
    from megarl.trainer.run_lock import RunDirLockedError
    from megarl.trainer.worker_group import WorkerError
    from megarl.utils.checksums import ChecksumError
    from megarl.utils.storage import StorageError, storage_error

    at = {"phase": context.phase, "step": context.step}
    if isinstance(error, (ConfigError, DataError, RewardFunctionError)):
        return RunFailure(EXIT_CONFIG, str(error), "", plain=True, **at)
    if isinstance(error, RunDirLockedError):
        return RunFailure(EXIT_LOCKED, str(error), error.fix, where=error.path, **at)
    if isinstance(error, CheckpointError):
        return RunFailure(EXIT_CHECKPOINT, error.problem, error.fix, where=error.file, **at)
    if isinstance(error, ChecksumError):  # a damaged file outside a resume's fallback (e.g. initial dist weights)
        return RunFailure(EXIT_CHECKPOINT, error.problem, "restore the file, or point the key that names it at an intact "
                          "checkpoint", where=error.file, **at)
    if isinstance(error, UnsafeCheckpointError):
        return RunFailure(EXIT_CHECKPOINT, str(error), "resume only checkpoints megarl wrote; delete or move this one",
                          **at)
    # a RewardError raised in a rollout worker that scored the sample as it finished (megarl.reward.streaming)
    streamed = isinstance(error, WorkerError) and error.error_type == "RewardError"
    if isinstance(error, RewardError) or streamed:
        return RunFailure(EXIT_REWARD, _first_lines(error.error_text if streamed else str(error)), (
            "fix the reward function (custom_reward_function.path / name) for this sample, or the sample in the data; "
            f"its traceback is in the log; then {_resume_hint(context)}"), where="reward function", **at)
    if isinstance(error, OSError):
        explained = error if isinstance(error, StorageError) else storage_error(error, error.filename or context.run_dir or ".")
        if explained is not None:
            return RunFailure(EXIT_STORAGE, explained.strerror, _storage_fix(explained.strerror, context), **at)
    if isinstance(error, WorkerError):
        where = f"{error.group} rank {error.rank} (pid {error.pid}), {error.method}"
        if error.error_type == "StorageError":
            return RunFailure(EXIT_STORAGE, _first_lines(error.error_text), _storage_fix(error.error_text, context),
                              where=where, **at)
        if error.died:
            return RunFailure(EXIT_WORKER, _first_lines(str(error).splitlines()[0]), (
                "look for the cause in the worker's output above (an out-of-memory kill, a segfault); then "
                f"{_resume_hint(context)}"), where=where, **at)
        if error.out_of_memory:
            from megarl.trainer.oom import oom_fix

            return RunFailure(EXIT_WORKER, _first_lines(f"out of GPU memory: {error.error_text}"), oom_fix(context.phase),
                              where=where, **at)
        problem = _first_lines(f"{error.error_type}: {error.error_text}")
        if context.phase == "load_checkpoint":
            return RunFailure(EXIT_CHECKPOINT, problem, (
                "the checkpoint does not fit this run (see the problem), or it is damaged: resume another one with "
                "trainer.resume_mode=resume_path, or start over with trainer.resume_mode=disable"), where=where, **at)
        return RunFailure(EXIT_WORKER, problem, f"the worker's traceback is in the log; fix the cause, then {_resume_hint(context)}",
                          where=where, **at)
    return RunFailure(EXIT_INTERNAL, f"internal error: {type(error).__name__}: {_first_lines(str(error))}", (
        "this is a megarl bug or an unforeseen environment problem; the log has the traceback (please report it), then "
        f"{_resume_hint(context)}"), **at)


def _log_text(failure: RunFailure, error: BaseException) -> str:
    parts = [failure.message(), "", "controller traceback:",
             "".join(traceback.format_exception(type(error), error, error.__traceback__))]
    for name, title in (("remote_traceback", "worker traceback"), ("scorer_traceback", "reward function traceback")):
        text = getattr(error, name, None)
        if text:
            parts += ["", f"{title}:", text]
    return "\n".join(parts) + "\n"


def write_log(failure: RunFailure, error: BaseException, run_dir: str | None) -> str | None:
    """Write the failure log under ``<run_dir>/logs`` (the temp dir when that fails, e.g. a full
    disk); returns its path."""
    name = f"failure_{time.strftime('%Y%m%d-%H%M%S')}_{os.getpid()}.log"
    text = _log_text(failure, error)
    for directory in ([os.path.join(run_dir, "logs")] if run_dir else []) + [tempfile.gettempdir()]:
        path = os.path.join(directory, name if directory != tempfile.gettempdir() else f"megarl_{name}")
        try:
            os.makedirs(directory, exist_ok=True)
            with open(path, "w") as handle:
                handle.write(text)
            return path
        except OSError as write_error:
            if write_error.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EROFS, errno.ENOENT, errno.EPERM):
                raise
    return None


def interrupted(code: int, context: FailureContext) -> str:
    """The line printed when Ctrl-C (``code`` 130) or SIGTERM (143) stopped the run, after its cleanup."""
    how = "interrupted (Ctrl-C)" if code == EXIT_INTERRUPTED else "stopped by SIGTERM"
    at = "" if context.phase is None else f" in phase {context.phase}"
    at += "" if context.step is None else f" at global step {context.step}"
    latest = context.latest or "none yet"
    return (f"megarl: {how}{at} (exit code {code}); last complete checkpoint: {latest}; the same command continues "
            "from it (trainer.resume_mode=auto)")


def explain(error: BaseException, context: FailureContext | None) -> RunFailure:
    """The RunFailure for ``error`` (with its log file written)."""
    context = context or FailureContext()
    failure = _classify(error, context)
    if not failure.plain:
        failure.log_file = write_log(failure, error, context.run_dir)
    return failure
