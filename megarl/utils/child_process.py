"""What a process that megarl forks does first: die with its parent, drop what it inherited.

A forked child shares every open file description of its parent. The driver holds the run
directory's lock (``trainer.run_lock``, an ``flock`` released only when the last descriptor of
it closes), its log and metrics files and Ray's sockets; a child keeping those outlives a
``kill -9`` of the driver holding the lock, so the next run on the directory is refused naming
a dead pid. ``detach_from_parent`` asks the kernel to SIGKILL the child when its parent dies
(Linux ``PR_SET_PDEATHSIG``; the "parent" is the thread that forked it, so fork from a thread
that lives as long as the child should) and closes every inherited descriptor but stdio and
the ones the child needs.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
from collections.abc import Iterable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def detach_from_parent(parent_pid: int, keep_fds: Iterable[int] = ()) -> None:
    """Call first thing in a child forked by ``parent_pid``: SIGKILL when that parent dies (exits
    now if it already has), and every descriptor closed but 0, 1, 2 and ``keep_fds``."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(0)
    close_fds_except(keep_fds)


def close_fds_except(keep_fds: Iterable[int]) -> None:
    """Close every file descriptor of this process but 0, 1, 2 and ``keep_fds``."""
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    limit = limit if limit != resource.RLIM_INFINITY else 1 << 20
    low = 3
    for fd in sorted({fd for fd in keep_fds if fd >= 3}):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, limit)
