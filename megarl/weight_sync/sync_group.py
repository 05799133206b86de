"""A process group across worlds: the trainer's rank 0 and the standalone engines (separate_async).

The trainer's ranks form one torch.distributed world (Megatron's) and every engine process has its
own (vLLM's); a process can hold only one default world, so the weight push uses a group outside
both: a TCPStore on the trainer's rank 0 and a gloo (CPU) or NCCL (GPU) process group built on it
directly, registered in neither world (the store opened when its port was chosen, where it was:
:mod:`megarl.parallel.rendezvous`). Its ranks are its own: the trainer's rank 0 is rank 0, engine
``i`` is rank ``i + 1``. Every collective is bounded by ``timeout_s``; with gloo a peer that died
fails the next collective at once (its connection closes).
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from megarl.parallel.rendezvous import take_rendezvous

BACKENDS = ("gloo", "nccl")


class SyncGroup:
    """This process's membership (``rank`` of ``size``) of the weight-push group rendezvousing at
    ``host:port`` (rank 0 serves the store). Implements ``megarl.weight_sync.transport.Broadcaster``."""

    def __init__(self, host: str, port: int, rank: int, size: int, backend: str, timeout_s: float) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"weight-push group backend must be one of {BACKENDS}, got {backend!r}")
        timeout = timedelta(seconds=timeout_s)
        self.rank, self.size, self.backend = rank, size, backend
        store = take_rendezvous("weight_push") if rank == 0 else None  # opened with the port, when it was
        if store is None:
            store = dist.TCPStore(host, port, size, rank == 0, timeout=timeout)
        store.set_timeout(timeout)
        prefixed = dist.PrefixStore("megarl_weight_push", store)
        if backend == "gloo":
            self.group = dist.ProcessGroupGloo(prefixed, rank, size, timeout)
        else:
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.group = dist.ProcessGroupNCCL(prefixed, rank, size, options)
        self._store = store  # rank 0 serves it for the group's life

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        """``tensor`` from group rank ``src`` to every member, in place (blocks until done)."""
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = src, 0
        self.group.broadcast([tensor], options).wait()

    def close(self) -> None:
        """Leave the group at the run's end, no broadcast in flight. NCCL: abort, which tears down this member's
        communicator alone. ``shutdown`` flushes through ncclCommFinalize and blocks by design (pytorch#141510)
        where the other members have not left, and the engines leave only after the trainer (separate_async,
        2 x H200, 2026-11-28: the trainer's shutdown ran out its 120 s bound)."""
        stop = getattr(self.group, "abort", None) if self.backend == "nccl" else getattr(self.group, "shutdown", None)
        if stop is not None:
            stop()
