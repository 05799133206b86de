"""The processes a run started, ended with it (Linux ``/proc``; elsewhere nothing is tracked).

``ray.shutdown`` of a Ray that ``ray.init`` started kills the raylet and the GCS and returns; the
raylet's workers and agents, reparented to init, go by themselves once they notice (the agents after
about a minute). After a rank was killed on 4 x H200, 14 of a run's processes, two of them holding
79 GB of GPU memory, were still there 5 s after the driver's exit, and gone about a minute later.
The driver lists the processes under the Ray node processes it started (its children running from
Ray's package) before the shutdown, as after it they are init's, and after a grace SIGKILLs those
left; its other children (a test's own subprocesses) are not touched. A process is named by its pid
and its start time, so a pid reused meanwhile is never touched.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

Process = tuple[int, int]  # (pid, start time in clock ticks since boot)


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state, start time) of ``pid``; None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), fields[0], int(fields[19])


def descendants(pid: int | None = None, child_cmd: str = "") -> set[Process]:
    """Every live (not zombie) descendant of ``pid`` (default: this process); with ``child_cmd``, only
    those under (and including) its children whose command line contains ``child_cmd``."""
    root = os.getpid() if pid is None else pid
    table = {}
    for entry in Path("/proc").iterdir() if Path("/proc/self/stat").exists() else ():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            table[int(entry.name)] = stat
    frontier = {p for p, (ppid, state, _) in table.items() if ppid == root and state != "Z" and child_cmd in _cmdline(p)}
    ours = set(frontier)
    while frontier:
        frontier = {p for p, (ppid, state, _) in table.items() if ppid in frontier and state != "Z"} - ours
        ours |= frontier
    return {(p, table[p][2]) for p in ours}


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def alive(processes: set[Process]) -> set[Process]:
    """Those of ``processes`` still running (a zombie, or a pid now another process's, counts as gone)."""
    return {(pid, start) for pid, start in processes
            if (stat := _stat(pid)) is not None and stat[2] == start and stat[1] != "Z"}


def end(processes: set[Process], grace_s: float) -> set[Process]:
    """Wait up to ``grace_s`` for ``processes`` to exit, SIGKILL those left and give them 5 s more;
    returns those still listed then (in the kernel: a GPU context's teardown; they go when it ends)."""
    deadline = time.monotonic() + grace_s
    while (left := alive(processes)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while (left := alive(left)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left
