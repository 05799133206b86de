"""SIGTERM ends the driver like Ctrl-C, with exit code 143 once its cleanup has run.

SIGTERM (``scancel``, a time limit, torchrun, ``kill``) raises ``SystemExit(143)`` in the main
thread, so the trainer's ``finally`` blocks run (workers stopped, an unfinished checkpoint
removed, Ray shut down); a second SIGTERM while that runs is ignored (Slurm's SIGKILL after
KillWait still ends a stuck one). Others replace the handler: ``ray.init`` installs a Python one
that exits 15, and Ray's core worker (2.60) a native failure handler that dumps a stack and
aborts (exit 134). ``exit_on_sigterm`` is called again after ``ray.init``, and
``exit_code_of`` maps a ``SystemExit(15)`` raised by such a handler to 143.
"""

from __future__ import annotations

import signal
import sys

EXIT_SIGTERM = 128 + signal.SIGTERM  # 143, the shell's code for "terminated"


def _on_sigterm(signum: int, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the cleanup this starts is not interrupted by another one
    print("[megarl] SIGTERM: stopping (workers, an unfinished checkpoint, Ray), then exit code 143", file=sys.stderr,
          flush=True)
    raise SystemExit(EXIT_SIGTERM)


def exit_on_sigterm() -> None:
    """(Re)install megarl's SIGTERM handler (main thread only, as Python requires)."""
    signal.signal(signal.SIGTERM, _on_sigterm)


def exit_code_of(code: object) -> object:
    """The exit code for ``SystemExit(code)``: another library's SIGTERM handler's ``sys.exit(15)`` is 143."""
    return EXIT_SIGTERM if code == signal.SIGTERM else code
