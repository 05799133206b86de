"""Dispatch/collect math: which slice of a batch each rank gets, whose output counts.

Pure functions of a :class:`~megarl.parallel.layout.ParallelLayout` (no processes):

* Megatron calls (training, log-probs, values), with the model's Megatron layout: the
  batch is cut into ``dp`` equal chunks; every rank of DP group ``d`` (all its TP/PP/CP
  ranks) gets chunk ``d``; DP group ``d``'s output is read from its rank with TP rank 0,
  last PP stage, CP rank 0.
* Generation, with the rollout layout ``ParallelLayout(world, tp=rollout TP)``: its DP
  groups are the vLLM replicas, so the same rule gives chunk ``r`` to every rank of
  replica ``r`` and reads the replica's output from its first rank.
"""

from __future__ import annotations

from typing import Sequence

from megarl.parallel.layout import ParallelLayout
from megarl.protocol import DataProto


def chunk_index(layout: ParallelLayout) -> tuple[list[int], list[int]]:
    """(chunk index per rank, collecting rank per chunk in chunk order) for ``layout.dp`` chunks."""
    chunk_of_rank = [layout.coordinates(rank).dp for rank in range(layout.world_size)]
    return chunk_of_rank, layout.output_ranks()


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
