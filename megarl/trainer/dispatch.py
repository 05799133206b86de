"""Dispatch/collect math: which slice of a batch each rank gets, whose output counts.

Pure functions over the per-rank coordinates that the workers report from
megatron's parallel_state (``RankCoords``), so they are testable without processes.

* DP mode (Megatron training/log-prob calls): the batch is cut into ``dp_size`` equal
  chunks; every rank of DP group ``d`` (all its TP/PP/CP ranks) gets chunk ``d``; the
  output of DP group ``d`` is read from its rank with TP rank 0, last PP stage, CP rank 0.
* Rollout mode (generation): the batch is cut into ``replicas`` chunks; every rank of
  replica ``r`` gets chunk ``r``; the replica's first rank returns it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from megarl.protocol import DataProto


@dataclass(frozen=True)
class RankCoords:
    """Where one rank sits. ``dp_*`` come from parallel_state; ``replica*`` from the rollout layout."""

    rank: int
    dp_rank: int
    dp_size: int
    tp_rank: int = 0
    pp_rank: int = 0
    pp_size: int = 1
    cp_rank: int = 0
    replica: int | None = None
    replicas: int | None = None
    replica_head: bool = False

    @property
    def holds_output(self) -> bool:
        """TP rank 0 of the last pipeline stage, CP rank 0."""
        return self.tp_rank == 0 and self.pp_rank == self.pp_size - 1 and self.cp_rank == 0


def _check_same(coords: Sequence[RankCoords], field: str) -> int:
    values = {getattr(c, field) for c in coords}
    if len(values) != 1 or None in values:
        raise ValueError(f"ranks disagree on {field}: {sorted(values, key=str)}")
    return int(values.pop())


def dp_chunk_index(coords: Sequence[RankCoords]) -> tuple[int, list[int], list[int]]:
    """(dp_size, chunk index per rank, collecting rank per DP group in DP order)."""
    dp_size = _check_same(coords, "dp_size")
    chunk = [c.dp_rank for c in coords]
    holders: dict[int, int] = {}
    for c in coords:
        if c.holds_output:
            if c.dp_rank in holders:
                raise ValueError(f"DP group {c.dp_rank} has two output ranks ({holders[c.dp_rank]}, {c.rank})")
            holders[c.dp_rank] = c.rank
    missing = [d for d in range(dp_size) if d not in holders]
    if missing:
        raise ValueError(f"DP groups {missing} have no rank holding the output (TP0, last PP stage, CP0)")
    return dp_size, chunk, [holders[d] for d in range(dp_size)]


def rollout_chunk_index(coords: Sequence[RankCoords]) -> tuple[int, list[int], list[int]]:
    """(replicas, chunk index per rank, collecting rank per replica in replica order)."""
    replicas = _check_same(coords, "replicas")
    chunk = [int(c.replica) for c in coords]
    heads: dict[int, int] = {}
    for c in coords:
        if c.replica_head:
            heads[int(c.replica)] = c.rank
    missing = [r for r in range(replicas) if r not in heads]
    if missing:
        raise ValueError(f"rollout replicas {missing} have no head rank")
    return replicas, chunk, [heads[r] for r in range(replicas)]


def scatter(data: DataProto, parts: int, chunk_of_rank: Sequence[int], pad: bool) -> tuple[list[DataProto], int]:
    """Per-rank inputs: ``data`` cut into ``parts`` equal chunks, chunk ``chunk_of_rank[i]`` to rank i.

    pad=True pads the batch to a multiple of ``parts`` (the caller unpads the result);
    pad=False requires divisibility (training: padded rows would be trained on).
    """
    if pad:
        data, pad_size = data.pad_to_divisor(parts)
    else:
        if len(data) % parts:
            raise ValueError(f"batch of {len(data)} rows does not split evenly over {parts} data-parallel ranks")
        pad_size = 0
    chunks = data.chunk(parts)
    return [chunks[i] for i in chunk_of_rank], pad_size


def gather(outputs: Sequence[DataProto], collect_ranks: Sequence[int], pad_size: int) -> DataProto:
    """Concatenate the collecting ranks' outputs in chunk order; drop ``pad_size`` trailing rows."""
    merged = DataProto.concat([outputs[r] for r in collect_ranks])
    return merged.unpad(pad_size) if pad_size else merged
