"""A group's rendezvous on its rank 0, listening from the moment its port is chosen.

Choosing a "free" port by binding to port 0, closing the socket and letting torch bind it later
races with every other socket of the machine: any outgoing connection (Ray's gRPC, a previous
test's process) may take that ephemeral port in between, and the group then fails to start with
``EADDRINUSE``. Here the rank-0 process opens torch's ``TCPStore`` on a port the kernel picks and
keeps it open until the group is built on it; the other ranks connect to ``host:port`` as usual.

Purposes: ``"world"`` (the default process group, :func:`megarl.parallel.init_distributed`) and
``"weight_push"`` (:class:`megarl.weight_sync.sync_group.SyncGroup`).
"""

from __future__ import annotations

from typing import Any

_stores: dict[str, Any] = {}  # purpose -> torch.distributed.TCPStore this process serves, until taken


def open_rendezvous(host: str, purpose: str) -> int:
    """Listen on a kernel-chosen port for ``purpose``'s group (once per purpose until taken); returns
    the port. ``host``: the address the other ranks reach this process at."""
    if purpose not in _stores:
        import torch.distributed as dist

        _stores[purpose] = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False)
    return _stores[purpose].port


def take_rendezvous(purpose: str) -> Any:
    """The store :func:`open_rendezvous` opened for ``purpose`` in this process (its group keeps it from
    now), else None."""
    return _stores.pop(purpose, None)
