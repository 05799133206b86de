"""Scoring calls in child processes, each bounded by a timeout (``reward.timeout``).

A reward function can hang (a regex that backtracks for hours, a sandbox that never
answers) or spin in C code that holds the GIL; a thread cannot be stopped, a process can.
``ScoringPool`` keeps ``processes`` forked children (started on first use, reused across
batches) that call the scorer; a call that has not returned ``timeout_s`` seconds after it
was handed out is abandoned: its process is killed (SIGKILL) and replaced, its result is
``Outcome("timeout")``. A child that dies (segfault, ``os._exit``) gives
``Outcome("error")``. Fork keeps the scorer (and any module it was loaded from) without
pickling it; only the arguments and the result cross the pipe. The trainer starts the
children (``start``) before Ray does, so they are forked from a process without Ray's
threads; only a replacement for a killed child is forked later. A scorer's changes to
Python state stay in its child. A child dies with its parent and keeps none of its parent's
descriptors but stdio and its pipe (megarl.utils.child_process): a ``kill -9`` of the driver
leaves no scorer running and the run directory unlocked. The kernel ties a child's life to the
thread that forked it, so every child is forked by the pool's own thread, which lives as long as
the pool (a caller's short-lived thread may run a batch).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable

from megarl.utils.child_process import detach_from_parent


@dataclass
class Outcome:
    """One call's result. kind: "ok" (``value``), "error" (``error_type``, ``error_text``,
    ``traceback``: the scorer's, from the child) or "timeout"."""

    kind: str
    value: Any = None
    error_type: str = ""
    error_text: str = ""
    traceback: str = ""


def _serve(fn: Callable[..., Any], conn: Connection, parent_pid: int) -> None:
    """Child loop: (index, args) in, (index, kind, payload) out, until the pipe closes."""
    detach_from_parent(parent_pid, keep_fds=[conn.fileno()])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if message is None:
            return
        index, args = message
        try:
            reply = (index, "ok", fn(*args))
        except BaseException as error:  # the scorer's own failure, reported with its traceback
            reply = (index, "error", (type(error).__name__, str(error), traceback.format_exc()))
        try:
            conn.send(reply)
        except Exception as error:  # e.g. an unpicklable result
            conn.send((index, "error", (type(error).__name__, f"the scorer's result could not be sent back: {error}", "")))


class _Child:
    def __init__(self, fn: Callable[..., Any]) -> None:
        ctx = multiprocessing.get_context("fork")
        self.conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(fn, child_conn, os.getpid()), daemon=True, name="megarl-reward")
        self.process.start()
        child_conn.close()

    def kill(self) -> None:
        if self.process.is_alive():
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.join(timeout=10)
        self.conn.close()


class ScoringPool:
    """``run(calls)`` -> one Outcome per call (same order), each call bounded by ``timeout_s``.

    Args:
        fn: the scorer, called as ``fn(*args)`` in a child process.
        processes: children running calls at once (1 keeps calls sequential).
        timeout_s: seconds a call may run after it was handed to a child.
    """

    def __init__(self, fn: Callable[..., Any], processes: int, timeout_s: float) -> None:
        self.fn, self.processes, self.timeout_s = fn, max(1, int(processes)), float(timeout_s)
        self._children: list[_Child] = []
        self._forker: ThreadPoolExecutor | None = None  # the thread that forks the children (started on first use)
        self._lock = threading.Lock()  # the async reward thread and the loop never overlap; be sure

    def start(self) -> None:
        """Fork all ``processes`` children now (they are otherwise forked on first use)."""
        with self._lock:
            while len(self._children) < self.processes:
                self._children.append(self._fork())

    def run(self, calls: list[tuple]) -> list[Outcome]:
        with self._lock:
            return self._run(calls)

    def _run(self, calls: list[tuple]) -> list[Outcome]:
        results: list[Outcome | None] = [None] * len(calls)
        pending = list(range(len(calls)))[::-1]  # popped from the end: in order
        busy: dict[int, tuple[_Child, int, float]] = {}  # fileno -> (child, call index, deadline)
        while pending or busy:
            while pending and len(busy) < self.processes:
                child = self._idle_child(busy)
                index = pending.pop()
                child.conn.send((index, calls[index]))
                busy[child.conn.fileno()] = (child, index, time.monotonic() + self.timeout_s)
            next_deadline = min(deadline for _, _, deadline in busy.values())
            ready = wait([child.conn for child, _, _ in busy.values()], timeout=max(0.0, next_deadline - time.monotonic()))
            for conn in ready:
                child, index, _ = busy.pop(conn.fileno())
                try:
                    got, kind, payload = conn.recv()
                except (EOFError, OSError):
                    code = child.process.exitcode
                    results[index] = Outcome("error", error_type="ScorerProcessDied",
                                             error_text=f"the scoring process exited (exit code {code}) during this call")
                    self._drop(child)
                    continue
                results[got] = (Outcome("ok", value=payload) if kind == "ok"
                                else Outcome("error", error_type=payload[0], error_text=payload[1], traceback=payload[2]))
            now = time.monotonic()
            for fileno, (child, index, deadline) in list(busy.items()):
                if deadline <= now:
                    busy.pop(fileno)
                    results[index] = Outcome("timeout")
                    self._drop(child)
        return results  # type: ignore[return-value]

    def _idle_child(self, busy: dict[int, tuple[_Child, int, float]]) -> _Child:
        working = {id(child) for child, _, _ in busy.values()}
        for child in self._children:
            if id(child) not in working:
                return child
        child = self._fork()
        self._children.append(child)
        return child

    def _fork(self) -> _Child:
        if self._forker is None:
            self._forker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="megarl-scoring-fork")
        return self._forker.submit(_Child, self.fn).result()

    def _drop(self, child: _Child) -> None:
        child.kill()
        self._children.remove(child)

    def close(self) -> None:
        """Stop every child (killed: a child may be stuck in a scorer)."""
        for child in self._children:
            child.kill()
        self._children = []
        if self._forker is not None:
            self._forker.shutdown(wait=False)
            self._forker = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
