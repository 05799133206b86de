"""Resource pools: trainer.nnodes x trainer.n_gpus_per_node slots as Ray placement groups.

One placement group per node (STRICT_PACK: its bundles land on one node), one bundle per
slot. With several nodes each group is pinned to its own node (Ray's ``node:<ip>`` resource),
so that CPU nodes, where Ray could pack two groups on one node, get one group each too.
A bundle is ``{"GPU": 1, "CPU": c}`` on CUDA and ``{"CPU": c}`` when
``trainer.device=cpu`` (c may be fractional, so several ranks share this machine's cores).
Worker groups that share the pool take fractions of each bundle (colocation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray

PLACEMENT_TIMEOUT_S = 600.0


@dataclass
class ResourcePool:
    """Slots of the cluster: ``placements[rank] = (placement_group, bundle_index)``."""

    placement_groups: list[Any]
    placements: list[tuple[Any, int]]
    use_gpu: bool
    cpus_per_slot: float

    @property
    def world_size(self) -> int:
        return len(self.placements)

    def release(self) -> None:
        for pg in self.placement_groups:
            ray.util.remove_placement_group(pg)


def create_resource_pool(nnodes: int, slots_per_node: int, use_gpu: bool, cpus_per_slot: float,
                         prefix: str = "trainer") -> ResourcePool:
    """Reserve ``nnodes`` placement groups of ``slots_per_node`` bundles; raise a clear error
    (naming <prefix>.nnodes / <prefix>.n_gpus_per_node, the keys that sized the pool) when the
    cluster cannot hold them."""
    from ray.util.placement_group import placement_group

    bundle = {"CPU": cpus_per_slot, **({"GPU": 1} if use_gpu else {})}
    pins = _node_pins(nnodes, slots_per_node, bundle, prefix) if nnodes > 1 else [{}]
    groups = [placement_group([{**bundle, **(pin if i == 0 else {})} for i in range(slots_per_node)], strategy="STRICT_PACK")
              for pin in pins]
    ready = [pg.ready() for pg in groups]
    done, _ = ray.wait(ready, num_returns=len(ready), timeout=PLACEMENT_TIMEOUT_S)
    if len(done) != len(ready):
        for pg in groups:
            ray.util.remove_placement_group(pg)
        raise RuntimeError(
            f"Ray cannot place {prefix}.nnodes={nnodes} x {prefix}.n_gpus_per_node={slots_per_node} "
            f"bundles of {bundle} within {PLACEMENT_TIMEOUT_S:.0f} s; cluster resources: "
            f"{ray.cluster_resources()}"
        )
    placements = [(pg, i) for pg in groups for i in range(slots_per_node)]
    return ResourcePool(groups, placements, use_gpu, cpus_per_slot)


def _node_pins(nnodes: int, slots_per_node: int, bundle: dict[str, float], prefix: str) -> list[dict[str, float]]:
    """One ``{"node:<ip>": 0.001}`` per placement group: ``nnodes`` alive nodes that can hold
    ``slots_per_node`` bundles, the driver's node first. Raises naming what the cluster has."""
    here = ray.util.get_node_ip_address()
    fitting, others = [], []
    for node in ray.nodes():
        if not node["Alive"]:
            continue
        ip, res = node["NodeManagerAddress"], node["Resources"]
        enough = all(res.get(k, 0) >= v * slots_per_node for k, v in bundle.items())
        (fitting if enough and f"node:{ip}" in res else others).append(ip)
    fitting.sort(key=lambda ip: ip != here)
    if len(fitting) < nnodes:
        raise RuntimeError(
            f"{prefix}.nnodes={nnodes} needs {nnodes} Ray nodes with {slots_per_node} x {bundle} each "
            f"({prefix}.n_gpus_per_node={slots_per_node}); the cluster has {len(fitting)} such node(s) {fitting}"
            + (f" and {len(others)} smaller {others}" if others else "")
            + f": start the missing nodes (launch/ray_cluster.sh worker) or lower {prefix}.nnodes"
        )
    return [{f"node:{ip}": 0.001} for ip in fitting[:nnodes]]
