"""Resource pools: trainer.nnodes x trainer.n_gpus_per_node slots as Ray placement groups.

One placement group per node (STRICT_PACK: its bundles land on one node), one bundle per
slot. A bundle is ``{"GPU": 1, "CPU": c}`` on CUDA and ``{"CPU": c}`` when
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


def create_resource_pool(nnodes: int, slots_per_node: int, use_gpu: bool, cpus_per_slot: float) -> ResourcePool:
    """Reserve ``nnodes`` placement groups of ``slots_per_node`` bundles; raise a clear error
    (naming trainer.nnodes / trainer.n_gpus_per_node) when the cluster cannot hold them."""
    from ray.util.placement_group import placement_group

    bundle = {"CPU": cpus_per_slot, **({"GPU": 1} if use_gpu else {})}
    groups = [placement_group([dict(bundle) for _ in range(slots_per_node)], strategy="STRICT_PACK")
              for _ in range(nnodes)]
    ready = [pg.ready() for pg in groups]
    done, _ = ray.wait(ready, num_returns=len(ready), timeout=PLACEMENT_TIMEOUT_S)
    if len(done) != len(ready):
        for pg in groups:
            ray.util.remove_placement_group(pg)
        raise RuntimeError(
            f"Ray cannot place trainer.nnodes={nnodes} x trainer.n_gpus_per_node={slots_per_node} "
            f"bundles of {bundle} within {PLACEMENT_TIMEOUT_S:.0f} s; cluster resources: "
            f"{ray.cluster_resources()}"
        )
    placements = [(pg, i) for pg in groups for i in range(slots_per_node)]
    return ResourcePool(groups, placements, use_gpu, cpus_per_slot)
