"""Two "machines" on this one: network namespaces joined by a veth pair (tests only; needs root and `ip`).

Each namespace has its own loopback (up) and one address on the pair (``10.213.<k>.1`` and
``.2``, ``k`` chosen per pair); nothing is added to the host's namespace. A process started with
``prefix(i)`` runs in node ``i``'s namespace and sees only its loopback and its end of the pair, as
on two machines: loopback shortcuts (an address the host name resolves to) fail across them.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class NodePair:
    names: tuple[str, str]  # the namespaces
    ips: tuple[str, str]  # each node's address on the pair

    def prefix(self, node: int) -> list[str]:
        """The command prefix that runs a command in node ``node``'s network namespace (only: `ip netns
        exec` would also remount /sys, hiding the cgroup mounts slurmd needs)."""
        return ["nsenter", f"--net=/run/netns/{self.names[node]}"]


def netns_available() -> str | None:
    """None when network namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "needs root (ip netns)"
    if shutil.which("ip") is None or shutil.which("nsenter") is None:
        return "needs iproute2's ip and util-linux's nsenter"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextmanager
def two_nodes(tag: str) -> Iterator[NodePair]:
    """Two namespaces ``mr<tag><pid>a`` / ``...b`` with a veth pair; removed afterwards."""
    base = f"mr{tag}{os.getpid() % 100000}"
    names = (f"{base}a", f"{base}b")
    subnet = random.randrange(1, 250)
    ips = (f"10.213.{subnet}.1", f"10.213.{subnet}.2")
    veth = (f"{base}x", f"{base}y")
    try:
        for name in names:
            _ip("netns", "add", name)
        _ip("link", "add", veth[0], "type", "veth", "peer", "name", veth[1])
        for name, dev, ip in zip(names, veth, ips):
            _ip("link", "set", dev, "netns", name)
            _ip("-n", name, "addr", "add", f"{ip}/24", "dev", dev)
            _ip("-n", name, "link", "set", dev, "up")
            _ip("-n", name, "link", "set", "lo", "up")
        yield NodePair(names, ips)
    finally:
        for name in names:  # deleting a namespace deletes its end of the pair, and so the pair
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
