"""Where each rank of each role sits: node, GPU, and its TP/PP/CP/EP/DP groups.

megarl colocates every role on every slot (``megarl.trainer.ppo_trainer.init_workers``):
slot ``node * n_gpus_per_node + gpu`` hosts global rank ``r`` of the actor (with its
rollout and reference) and, when they run, rank ``r`` of the critic, the reward model and the
distillation teacher (but for a teacher on its own pool, ``distillation.nnodes > 0``). The groups come
from :class:`~megarl.parallel.layout.ParallelLayout` (megatron's ``tp-cp-ep-dp-pp`` order).

Small worlds are listed per GPU (:func:`slot_lines`) with their first groups; large ones per
run of alike nodes (:func:`node_lines`: nodes whose ranks differ only in their data-parallel
index and rollout replica) with group counts and one example group per kind.
"""

from __future__ import annotations

from collections import defaultdict

from megarl.parallel.layout import ParallelLayout

__all__ = ["groups", "slot_lines", "node_lines", "group_lines", "ranks_text"]

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


def ranks_text(ranks: list[int]) -> str:
    """Sorted ranks compressed: ``0-7``, ``0-508 step 4``, ``0-3,8-11``."""
    if len(ranks) >= 3 and len({b - a for a, b in zip(ranks, ranks[1:])}) == 1:
        step = ranks[1] - ranks[0]
        return f"{ranks[0]}-{ranks[-1]}" + (f" step {step}" if step != 1 else "")
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return ",".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)


def group_lines(name: str, layout: ParallelLayout, shown: int = 4, compact: bool = False) -> list[str]:
    """One line per parallel dimension of size > 1 (or the DP line): its groups, the first
    ``shown``; ``compact``: their count, size and the first as an example."""
    lines = [f"{name}: {layout.world_size} ranks, TP={layout.tp} PP={layout.pp} CP={layout.cp} "
             f"EP={layout.ep} expert-TP={layout.etp} DP={layout.dp}" + (f" VPP={layout.vpp}" if layout.vpp else "")]
    sizes = {"tp": layout.tp, "pp": layout.pp, "cp": layout.cp, "dp": layout.dp, "ep": layout.ep}
    for dim, size in sizes.items():
        if size == 1 and dim != "dp":
            continue
        found = groups(layout, dim)
        if compact:
            lines.append(f"  {dim.upper()} groups: {len(found)} of {size} ranks, e.g. [{ranks_text(found[0])}]")
            continue
        more = f" ... ({len(found)} groups)" if len(found) > shown else ""
        lines.append(f"  {dim.upper()} groups: " + " ".join(str(g) for g in found[:shown]) + more)
    return lines


def slot_lines(nnodes: int, per_node: int, roles: dict[str, ParallelLayout], rollout_tp: int | None) -> list[str]:
    """One line per GPU: ``node n gpu g rank r: actor dp/tp/pp/cp/ep, rollout replica, ...``
    (``rollout_tp`` None: no vLLM replica on these GPUs, as with separate_async)."""
    rollout = None if rollout_tp is None else ParallelLayout(nnodes * per_node, tp=rollout_tp)
    lines = []
    for node in range(nnodes):
        for gpu in range(per_node):
            rank = node * per_node + gpu
            parts = []
            for name, layout in roles.items():
                c = layout.coordinates(rank)
                ep = f" ep{c.ep}" if layout.ep > 1 else ""
                parts.append(f"{name} dp{c.dp} tp{c.tp} pp{c.pp} cp{c.cp}{ep}")
            if rollout is not None:
                r = rollout.coordinates(rank)
                parts.append(f"rollout replica {r.dp} tp{r.tp}" + (" (head)" if r.tp == 0 else ""))
            lines.append(f"node {node} gpu {gpu} (rank {rank}): " + "; ".join(parts))
    return lines


def _node(ranks: range, roles: dict[str, ParallelLayout], rollout: ParallelLayout | None) -> tuple[tuple, str, str]:
    """(what the node's ranks hold but for DP index and replica, that as text, the DP indices and
    replicas as text) of one node."""
    shape, parts, shifted = [], [], []
    for name, layout in roles.items():
        coords = [layout.coordinates(r) for r in ranks]
        dims = [(d, sorted({getattr(c, d) for c in coords})) for d in ("tp", "pp", "cp", "ep")
                if d != "ep" or layout.ep > 1]
        dp = sorted({c.dp for c in coords})
        shape.append((name, tuple((d, tuple(v)) for d, v in dims), len(dp)))
        parts.append(f"{name} " + " ".join(f"{d}{ranks_text(v)}" for d, v in dims))
        shifted.append(f"{name} dp{ranks_text(dp)}")
    if rollout is not None:
        coords = [rollout.coordinates(r) for r in ranks]
        tps, replicas = sorted({c.tp for c in coords}), sorted({c.dp for c in coords})
        shape.append(("rollout", tuple(tps), len(replicas)))
        parts.append(f"rollout tp{ranks_text(tps)}")
        shifted.append(f"rollout replica {ranks_text(replicas)}")
    return tuple(shape), "; ".join(parts), ", ".join(shifted)


def node_lines(nnodes: int, per_node: int, roles: dict[str, ParallelLayout], rollout_tp: int | None) -> list[str]:
    """One line per run of consecutive nodes whose ranks hold the same TP/PP/CP/EP coordinates
    (their DP indices and rollout replicas shifting from node to node): the coordinates, then
    the DP indices and replicas on the run's first and last node."""
    rollout = None if rollout_tp is None else ParallelLayout(nnodes * per_node, tp=rollout_tp)
    runs: list[tuple[tuple, str, list[tuple[int, str]]]] = []
    for node in range(nnodes):
        shape, text, shifted = _node(range(node * per_node, (node + 1) * per_node), roles, rollout)
        if runs and runs[-1][0] == shape:
            runs[-1][2].append((node, shifted))
        else:
            runs.append((shape, text, [(node, shifted)]))
    lines = []
    for _, text, nodes in runs:
        (first, first_shifted), (last, last_shifted) = nodes[0], nodes[-1]
        where = f"node {first}" if first == last else f"nodes {first}-{last}"
        span = f"ranks {first * per_node}-{(last + 1) * per_node - 1}"
        tail = first_shifted if first == last else f"{first_shifted} on node {first} .. {last_shifted} on node {last}"
        lines.append(f"{where} ({span}, {per_node} per node): {text}; {tail}")
    return lines
