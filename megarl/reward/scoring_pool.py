"""Scoring calls in child processes, in parallel, each bounded by a timeout (``reward.timeout``)
and all of a batch by a deadline (``reward.phase_timeout``).

A reward function can hang (a regex that backtracks for hours, a sandbox that never
answers) or spin in C code that holds the GIL; a thread cannot be stopped, a process can.
``ScoringPool`` keeps ``processes`` forked children (started on first use, reused across
batches) that call the scorer, up to ``processes`` calls at once; a call that has not returned
``timeout_s`` seconds after it was handed out is abandoned: its process is killed (SIGKILL) and
replaced, its result is ``Outcome("timeout")``. When the batch's deadline passes, the calls still
running are killed the same way and those and the ones not started are ``Outcome("pending")``:
the caller decides (megarl.reward.managers). A child that dies (segfault, ``os._exit``) gives
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


_POLL_S = 0.05  # how often a run with calls waiting looks for a child another run gave back


@dataclass
class Outcome:
    """One call's result. kind: "ok" (``value``), "error" (``error_type``, ``error_text``,
    ``traceback``: the scorer's, from the child), "timeout" (cut at the pool's ``timeout_s``) or
    "pending" (not done by the run's deadline)."""

    kind: str
    value: Any = None
    error_type: str = ""
    error_text: str = ""
    traceback: str = ""


def _serve(fn: Callable[..., Any], conn: Connection, parent_pid: int) -> None:
    """Child loop: (index, args) in, (index, kind, payload) out, until the pipe closes."""
    detach_from_parent(parent_pid, keep_fds=[conn.fileno()])
    for sig in (signal.SIGINT, signal.SIGTERM):  # Ctrl-C, scancel: the parent's to handle (it kills its children)
        signal.signal(sig, signal.SIG_IGN)
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
    """``run(calls, deadline)`` -> one Outcome per call (same order): at most ``processes`` calls at
    once, each bounded by ``timeout_s`` after it was handed out, all of them by ``deadline``.

    Several threads may ``run`` at once (streamed scoring: one call each); together they use at most
    ``processes`` children.

    Args:
        fn: the scorer, called as ``fn(*args)`` in a child process.
        processes: children running calls at once (``reward.num_workers``; 1 keeps calls sequential).
        timeout_s: seconds a call may run after it was handed to a child (``reward.timeout``).
    """

    def __init__(self, fn: Callable[..., Any], processes: int, timeout_s: float) -> None:
        self.fn, self.processes, self.timeout_s = fn, max(1, int(processes)), float(timeout_s)
        self._idle: list[_Child] = []  # children no call runs on
        self._children: set[_Child] = set()  # all of them (idle or running a call)
        self._changed = threading.Condition()  # a child became idle, or one was dropped
        self._forker: ThreadPoolExecutor | None = None  # the thread that forks the children (started on first use)

    def start(self) -> None:
        """Fork all ``processes`` children now (they are otherwise forked on first use)."""
        with self._changed:
            while len(self._children) < self.processes:
                child = self._fork()
                self._children.add(child)
                self._idle.append(child)

    def run(self, calls: list[tuple], deadline: float | None = None) -> list[Outcome]:
        """One Outcome per call: "ok" / "error", "timeout" (cut at ``timeout_s``), or "pending" (not done
        by ``deadline``, a ``time.monotonic()`` time: its child killed, or never started)."""
        results: list[Outcome | None] = [None] * len(calls)
        waiting = list(range(len(calls)))[::-1]  # popped from the end: in order
        busy: dict[int, tuple[_Child, int, float]] = {}  # fileno -> (child, call index, its own deadline)
        end = float("inf") if deadline is None else deadline
        while waiting or busy:
            while waiting and time.monotonic() < end:
                child = self._take(until=end if not busy else None)  # wait for a child only with nothing to collect
                if child is None:
                    break
                index = waiting.pop()
                child.conn.send((index, calls[index]))
                busy[child.conn.fileno()] = (child, index, min(time.monotonic() + self.timeout_s, end))
            if not busy:
                break  # the deadline passed before a child was free
            next_deadline = min(d for _, _, d in busy.values())
            poll = _POLL_S if waiting else float("inf")  # a child another thread frees is not on our pipes
            ready = wait([c.conn for c, _, _ in busy.values()], timeout=max(0.0, min(next_deadline - time.monotonic(), poll)))
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
                self._give(child)
                results[got] = (Outcome("ok", value=payload) if kind == "ok"
                                else Outcome("error", error_type=payload[0], error_text=payload[1], traceback=payload[2]))
            now = time.monotonic()
            for fileno, (child, index, call_deadline) in list(busy.items()):
                if call_deadline <= now:
                    busy.pop(fileno)
                    results[index] = Outcome("pending" if call_deadline >= end else "timeout")
                    self._drop(child)
        for index in waiting:
            results[index] = Outcome("pending")
        return results  # type: ignore[return-value]

    def _take(self, until: float | None) -> _Child | None:
        """An idle child (forked if fewer than ``processes`` exist); None when there is none now and
        ``until`` is None, or none became idle before ``until``."""
        with self._changed:
            while True:
                if self._idle:
                    return self._idle.pop()
                if len(self._children) < self.processes:
                    child = self._fork()
                    self._children.add(child)
                    return child
                left = None if until is None else until - time.monotonic()
                if left is None or left <= 0:
                    return None
                self._changed.wait(timeout=min(left, 1.0))

    def _give(self, child: _Child) -> None:
        with self._changed:
            self._idle.append(child)
            self._changed.notify()

    def _drop(self, child: _Child) -> None:
        child.kill()
        with self._changed:
            self._children.discard(child)
            self._changed.notify()

    def _fork(self) -> _Child:
        if self._forker is None:
            self._forker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="megarl-scoring-fork")
        return self._forker.submit(_Child, self.fn).result()

    def close(self) -> None:
        """Stop every child (killed: a child may be stuck in a scorer)."""
        with self._changed:
            children, self._children, self._idle = list(self._children), set(), []
        for child in children:
            child.kill()
        if self._forker is not None:
            self._forker.shutdown(wait=False)
            self._forker = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
