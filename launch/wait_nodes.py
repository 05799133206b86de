"""Wait (bounded) until a Ray cluster has the expected nodes alive; name the missing ones.

    python launch/wait_nodes.py --address HOST:PORT --nodes N [--expect [NAME=]IP ...] [--timeout S]

Exit 0 when N nodes (and every ``--expect`` IP) are alive; exit 3 after ``--timeout``
seconds with a message naming the nodes that never joined (``NAME (IP)``: Slurm's node names
come with their addresses), or how many are missing when none were named.
Used by launch/ray_cluster.sh, launch/node_entry.py and launch/slurm_megarl.sbatch instead
of fixed sleeps.
"""

from __future__ import annotations

import argparse
import sys
import time

EXIT_MISSING = 3


def alive_nodes(address: str) -> dict[str, dict]:
    """node IP -> resources of every alive node of the cluster at ``address``."""
    import ray

    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    return {n["NodeManagerAddress"]: n["Resources"] for n in ray.nodes() if n["Alive"]}


def _as_ray_names(ip: str) -> str:
    """Ray registers a node started with 127.0.0.1 / localhost under the host's address."""
    import ray

    return ray.util.get_node_ip_address() if ip in ("127.0.0.1", "localhost") else ip


def _named(entry: str) -> tuple[str, str]:
    """``NAME=IP`` or ``IP`` -> (IP as Ray names it, how messages name the node)."""
    name, _, ip = entry.rpartition("=")
    ray_ip = _as_ray_names(ip)
    return ray_ip, f"{name} ({ray_ip})" if name else ray_ip


def wait_for_nodes(address: str, nodes: int, expect: list[str], timeout_s: float, poll_s: float = 1.0) -> dict[str, dict]:
    """Poll until ``nodes`` nodes and every ``[NAME=]IP`` in ``expect`` are alive; raise TimeoutError
    naming the missing ones."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = alive_nodes(address)
        wanted = dict(_named(entry) for entry in expect)
        missing = [label for ip, label in wanted.items() if ip not in alive]
        if len(alive) >= nodes and not missing:
            return alive
        if time.monotonic() > deadline:
            named = f"missing node(s) {', '.join(missing)}" if missing else f"{nodes - len(alive)} node(s) missing"
            raise TimeoutError(f"Ray cluster at {address}: {named} after {timeout_s:.0f} s; alive: {sorted(alive)} "
                               f"(expected {nodes} node(s){': ' + ', '.join(wanted.values()) if wanted else ''}). "
                               "Check that the worker started there and can reach the head's port"
                               f"{'' if wanted else ' (EXPECT_NODES=<[name=]ip ...> names the nodes you expect)'}.")
        time.sleep(poll_s)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--address", required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--expect", nargs="*", default=[], help="nodes that must be among them: IP or NAME=IP")
    p.add_argument("--timeout", type=float, default=300.0)
    args = p.parse_args()
    try:
        alive = wait_for_nodes(args.address, args.nodes, args.expect, args.timeout)
    except TimeoutError as error:
        print(f"megarl launch: {error}", file=sys.stderr)
        return EXIT_MISSING
    for ip, res in sorted(alive.items()):
        print(f"megarl launch: node {ip}: CPU={res.get('CPU', 0):g} GPU={res.get('GPU', 0):g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
