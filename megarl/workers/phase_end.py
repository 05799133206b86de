"""The end of a colocate_async generation phase, one moment for every replica.

Each replica generates until its share of the step's batch is finished, but the step waits for the
slowest replica: a replica whose share came part-done (its long samples were interrupted at the last
phase) or held no long sample would sit idle meanwhile (4 x H200, benchmarks/RESULTS.md tenth session:
the slowest replica's engine time 2.6x the mean). So a replica that finished its share keeps
generating its newer groups until every replica has finished its share (work-conserving); then all
pause together. The replicas' leaders count themselves in the world's rendezvous store (the TCPStore
at ``MASTER_ADDR:MASTER_PORT`` that rank 0 serves), one key per phase.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

POLL_S = 0.01  # at most one store read per 10 ms (a round trip is ~0.1 ms on one host, a decode step 1-30 ms)


class PhaseEnd:
    """Args: ``replicas``, the rollout replicas whose leaders each call :meth:`arrive` once per phase
    (in the same order of phases: ``advance`` is collective over the world)."""

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas
        self.phase = 0
        self._store = None

    def arrive(self) -> Callable[[], bool]:
        """This replica's share of the current phase is finished; returns the test "every replica's is"
        (true for good once it was; reads the store at most once per :data:`POLL_S`)."""
        import torch.distributed as dist

        if self._store is None:
            self._store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
        key = f"megarl/phase_end/{self.phase}"
        self.phase += 1
        state = {"all": self._store.add(key, 1) >= self.replicas, "read": time.monotonic()}

        def everyone() -> bool:
            if not state["all"] and time.monotonic() - state["read"] >= POLL_S:
                state["all"] = self._store.add(key, 0) >= self.replicas
                state["read"] = time.monotonic()
            return state["all"]

        return everyone
