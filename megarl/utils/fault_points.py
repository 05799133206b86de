"""Named pause points for the fault tests and fault runs (kill a process at a known place).

Driver: ``MEGARL_PAUSE_AT=<phase>@<step>`` makes the driver print ``[megarl] paused at <phase> of
step <step>`` and sleep forever when it reaches that point, so a test can ``kill -9`` it there.
Points: ``update_actor`` (mid-iteration: rollout, rewards and log-probs done, the actor not yet
updated) and ``save_checkpoint`` (mid-save: ``actor/`` and ``critic/`` written, ``trainer.pt`` and
the tracker not yet).

One rank of a worker group: ``MEGARL_PAUSE_AT=<point>@<n>:rank<r>`` pauses rank ``r`` (``$RANK``) at
its ``n``-th pass through the point, printing ``[megarl] rank <r> (pid <pid>) paused at <point> <n>``;
the other ranks go on into the next collective and wait there, as behind a stalled or dead peer (kill
the paused pid: a rank dead mid-phase; leave it: the collective timeout, ``nccl_timeout``). Points:
``weight_sync`` (a sync into vLLM with the actor's parameters and vLLM's weights on the device, before
the first bucket moves) and ``update_microbatch`` (an actor update micro-batch's loss, after its
forward). Workers see the driver's environment (Ray starts them from it).

Unset (always, outside tests and fault runs): no effect.
"""

from __future__ import annotations

import os
import time

ENV = "MEGARL_PAUSE_AT"
_passes: dict[str, int] = {}


def pause_point(phase: str, step: int) -> None:
    """Block forever when ``$MEGARL_PAUSE_AT`` is ``"<phase>@<step>"``; return at once otherwise."""
    want = os.environ.get(ENV)
    if not want or want != f"{phase}@{step}":
        return
    print(f"[megarl] paused at {phase} of step {step} ({ENV}={want})", flush=True)
    while True:
        time.sleep(3600)


def rank_pause_point(point: str) -> None:
    """Block forever when ``$MEGARL_PAUSE_AT`` is ``"<point>@<n>:rank<r>"``, this process is rank ``r`` and
    this is its ``n``-th pass through ``point``; count the pass and return otherwise."""
    want = os.environ.get(ENV)
    if not want or not want.startswith(f"{point}@"):
        return
    _passes[point] = _passes.get(point, 0) + 1
    if want != f"{point}@{_passes[point]}:rank{os.environ.get('RANK')}":
        return
    print(f"[megarl] rank {os.environ.get('RANK')} (pid {os.getpid()}) paused at {point} {_passes[point]} "
          f"({ENV}={want})", flush=True)
    while True:
        time.sleep(3600)
