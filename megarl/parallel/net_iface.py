"""Which network interface gloo and NCCL bind to: the one that reaches the rendezvous (``MASTER_ADDR``).

Without ``GLOO_SOCKET_IFNAME`` gloo binds to the address the host name resolves to, and Debian and
Ubuntu map the host name to 127.0.0.1 / 127.0.1.1: on two machines each rank then tells the others to
connect to its loopback ("connectFullMesh ... Connection refused, remote=[127.0.0.1]"). NCCL picks
its bootstrap interface by its own rules. ``use_route_to_master`` sets both variables, unless the
user set them, to the interface the kernel routes ``MASTER_ADDR`` through (for the rank on the master's
own node: the interface that holds that address), found with a UDP ``connect`` (which sends nothing).
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import struct

logger = logging.getLogger(__name__)

IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
_SIOCGIFADDR = 0x8915  # <linux/sockios.h>: an interface's IPv4 address


def interface_towards(address: str) -> str | None:
    """The name of the local interface whose address the kernel sends to ``address`` from, or None."""
    ip = socket.gethostbyname(address)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((ip, 9))  # the discard port; connect() on UDP only chooses the route
        local = probe.getsockname()[0]
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:  # no IPv4 address on it
                continue
            if socket.inet_ntoa(raw[20:24]) == local:
                return name
    return None


def use_route_to_master() -> list[str]:
    """Set GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME (those not set already) for ``$MASTER_ADDR``;
    returns the variables it set."""
    master = os.environ.get("MASTER_ADDR")
    unset = [var for var in IFNAME_VARS if not os.environ.get(var)]
    if not master or not unset:
        return []
    name = interface_towards(master)
    if name is None:
        logger.warning("no local interface found for the route to MASTER_ADDR=%s; gloo / NCCL choose their own "
                       "(set GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME to choose)", master)
        return []
    for var in unset:
        os.environ[var] = name
    logger.info("%s=%s: the interface that reaches MASTER_ADDR=%s", "/".join(unset), name, master)
    return unset
