"""One run per ``trainer.default_local_dir``: a second run on the same directory is refused.

``hold_run_dir(path)`` takes an exclusive ``flock`` on ``<path>/.megarl.lock`` for as long as
the ``with`` block runs and writes the holder (pid, host, start time) into the file for the
refusal message. The kernel releases a flock when its process exits in any way (crash,
``kill -9``), so a dead run never leaves the directory locked; on NFS the server does so when
the client's lease expires. Without the lock, two runs on one directory both "succeed": the
second replaces every checkpoint of the first and both append to ``metrics.jsonl``.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

LOCK_FILE = ".megarl.lock"


class RunDirLockedError(RuntimeError):
    """Another live run holds the directory. ``path``: the directory; ``holder``: who holds it."""

    def __init__(self, path: str, holder: str) -> None:
        self.path, self.holder = path, holder
        super().__init__(
            f"trainer.default_local_dir={path} is in use by another megarl run ({holder}); a second run there would "
            "overwrite its checkpoints and interleave its metrics.jsonl"
        )

    fix = ("wait for that run to end (or stop it), or give this run its own directory: trainer.default_local_dir=<dir> "
           "(or another trainer.experiment_name)")


@contextmanager
def hold_run_dir(path: str) -> Iterator[None]:
    """Hold ``path`` (created if missing) for the duration of the block; RunDirLockedError if
    another process (or another block in this one) holds it."""
    os.makedirs(path, exist_ok=True)
    lock_path = os.path.join(path, LOCK_FILE)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "holder unknown"
            raise RunDirLockedError(os.path.abspath(path), holder) from None
        started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()}, started {started}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # the next run reads no stale holder if it races our exit
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
