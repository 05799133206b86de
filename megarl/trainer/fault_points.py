"""Named pause points for the fault tests (kill the driver at a known place).

``MEGARL_PAUSE_AT=<phase>@<step>`` makes the driver print ``[megarl] paused at <phase> of
step <step>`` and sleep forever when it reaches that point, so a test can ``kill -9`` it
there. Points: ``update_actor`` (mid-iteration: rollout, rewards and log-probs done, the
actor not yet updated) and ``save_checkpoint`` (mid-save: ``actor/`` and ``critic/``
written, ``trainer.pt`` and the tracker not yet). Unset (always, outside tests): no effect.
"""

from __future__ import annotations

import os
import time

ENV = "MEGARL_PAUSE_AT"
PHASES = ("update_actor", "save_checkpoint")


def pause_point(phase: str, step: int) -> None:
    """Block forever when ``$MEGARL_PAUSE_AT`` is ``"<phase>@<step>"``; return at once otherwise."""
    want = os.environ.get(ENV)
    if not want or want != f"{phase}@{step}":
        return
    print(f"[megarl] paused at {phase} of step {step} ({ENV}={want})", flush=True)
    while True:
        time.sleep(3600)
