"""Rank 0's rendezvous, listening from the moment its port is chosen.

Choosing a "free" port by binding to port 0, closing the socket and letting torch bind it later
races with every other socket of the machine: any outgoing connection (Ray's gRPC, a previous
test's process) may take that ephemeral port in between, and the group then fails to start with
``EADDRINUSE``. Here rank 0's process opens torch's ``TCPStore`` on a port the kernel picks and
keeps it open; :func:`megarl.parallel.init_distributed` builds the default group on that store, the
other ranks reach it through ``MASTER_ADDR`` / ``MASTER_PORT`` as usual.
"""

from __future__ import annotations

from typing import Any

_store: Any = None  # torch.distributed.TCPStore of this process, when it is a group's rank 0


def open_rendezvous(host: str) -> int:
    """Listen on a kernel-chosen port of this machine (idempotent); returns the port.
    ``host``: the address the other ranks use to reach this one (``MASTER_ADDR``)."""
    global _store
    if _store is None:
        import torch.distributed as dist

        _store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False)
    return _store.port


def held_store() -> Any:
    """The store :func:`open_rendezvous` opened in this process, else None."""
    return _store
