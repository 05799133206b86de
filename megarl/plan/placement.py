"""Where each rank of each role sits: node, GPU, and its TP/PP/CP/EP/DP groups.

megarl colocates every role on every slot (``megarl.trainer.ppo_trainer.init_workers``):
slot ``node * n_gpus_per_node + gpu`` hosts global rank ``r`` of the actor (with its
rollout and reference) and, when a critic runs, rank ``r`` of the critic. The groups come
from :class:`~megarl.parallel.layout.ParallelLayout` (megatron's ``tp-cp-ep-dp-pp`` order).
"""

from __future__ import annotations

from collections import defaultdict

from megarl.parallel.layout import ParallelLayout

__all__ = ["groups", "slot_lines", "group_lines"]

DENSE_DIMS = ("tp", "cp", "dp", "pp")
EXPERT_DIMS = ("etp", "ep", "expert_dp")


def groups(layout: ParallelLayout, dim: str) -> list[list[int]]:
    """The ranks of each ``dim`` group (ranks that differ only in ``dim``), in rank order."""
    others = [d for d in (DENSE_DIMS if dim in DENSE_DIMS else EXPERT_DIMS + ("pp",)) if d != dim]
    found: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for rank in range(layout.world_size):
        c = layout.coordinates(rank)
        found[tuple(getattr(c, d) for d in others)].append(rank)
    return list(found.values())


def group_lines(name: str, layout: ParallelLayout, shown: int = 4) -> list[str]:
    """One line per parallel dimension of size > 1 (or the DP line): its groups, the first ``shown``."""
    lines = [f"{name}: {layout.world_size} ranks, TP={layout.tp} PP={layout.pp} CP={layout.cp} "
             f"EP={layout.ep} expert-TP={layout.etp} DP={layout.dp}" + (f" VPP={layout.vpp}" if layout.vpp else "")]
    sizes = {"tp": layout.tp, "pp": layout.pp, "cp": layout.cp, "dp": layout.dp, "ep": layout.ep}
    for dim, size in sizes.items():
        if size == 1 and dim != "dp":
            continue
        found = groups(layout, dim)
        more = f" ... ({len(found)} groups)" if len(found) > shown else ""
        lines.append(f"  {dim.upper()} groups: " + " ".join(str(g) for g in found[:shown]) + more)
    return lines


def slot_lines(nnodes: int, per_node: int, roles: dict[str, ParallelLayout], rollout_tp: int) -> list[str]:
    """One line per GPU: ``node n gpu g rank r: actor dp/tp/pp/cp/ep, rollout replica, ...``."""
    rollout = ParallelLayout(nnodes * per_node, tp=rollout_tp)
    lines = []
    for node in range(nnodes):
        for gpu in range(per_node):
            rank = node * per_node + gpu
            parts = []
            for name, layout in roles.items():
                c = layout.coordinates(rank)
                ep = f" ep{c.ep}" if layout.ep > 1 else ""
                parts.append(f"{name} dp{c.dp} tp{c.tp} pp{c.pp} cp{c.cp}{ep}")
            r = rollout.coordinates(rank)
            parts.append(f"rollout replica {r.dp} tp{r.tp}" + (" (head)" if r.tp == 0 else ""))
            lines.append(f"node {node} gpu {gpu} (rank {rank}): " + "; ".join(parts))
    return lines
