"""Cleanup that talks to a cluster which may be going away, bounded in time.

``scancel`` sends SIGTERM to every step of a job at once: while the driver cleans up, the Ray
nodes drain and stop, and a call to them (killing the worker actors, ``ray.shutdown``) may wait
for the GCS until Slurm's SIGKILL (KillWait, 30 s by default) ends the driver before it said
anything. ``within`` gives such a call its own thread and a time limit; past it the driver goes
on with its local cleanup (the workers die with their raylets anyway).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

CLEANUP_TIMEOUT_S = 20.0  # under Slurm's default KillWait (30 s)


def within(seconds: float, what: str, fn: Callable[..., Any], *args: Any) -> bool:
    """Run ``fn(*args)`` for at most ``seconds``; False (and a line saying so) when it did not finish.
    An exception of ``fn`` is printed, not raised: cleanup goes on."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn(*args)
        except BaseException as error:  # reported below; the caller's cleanup continues
            errors.append(error)

    thread = threading.Thread(target=run, name=f"megarl-cleanup-{what}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        print(f"[megarl] {what} did not finish within {seconds:g} s (is the cluster going down?); going on", flush=True)
        return False
    if errors:
        print(f"[megarl] {what}: {type(errors[0]).__name__}: {errors[0]}", flush=True)
    return not errors
