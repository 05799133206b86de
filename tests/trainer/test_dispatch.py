"""Dispatch/collect split math against hand-derived rank layouts, and batch balancing."""

import numpy as np
import pytest
import torch

from megarl.parallel.layout import ParallelLayout
from megarl.protocol import DataProto
from megarl.trainer.balance import balance_order, balanced_partitions
from megarl.trainer.dispatch import chunk_index, gather, scatter


def _rows(n):
    return DataProto.from_dict({"x": torch.arange(n).unsqueeze(1)}, non_tensors={"i": np.arange(n, dtype=object)})


def test_tp2_pp2_dp2_split_and_collect():
    layout = ParallelLayout(world_size=8, tp=2, pp=2)
    chunk, collect = chunk_index(layout)
    assert layout.dp == 2
    # Megatron's order (tp fastest, then dp, then pp): ranks 0,1 (dp0, stage 0), 2,3 (dp1, stage 0),
    # 4,5 (dp0, stage 1), 6,7 (dp1, stage 1).
    assert chunk == [0, 0, 1, 1, 0, 0, 1, 1]
    assert collect == [4, 6]  # TP rank 0 of the last stage of each DP group
    inputs, pad = scatter(_rows(6), layout.dp, chunk, pad=True)
    assert pad == 0
    assert [x.batch["x"][:, 0].tolist() for x in inputs] == [[0, 1, 2], [0, 1, 2], [3, 4, 5], [3, 4, 5]] * 2
    # Each rank "computes" 10*x; gather reads ranks 4 and 6 only.
    outputs = [DataProto.from_dict({"y": x.batch["x"] * 10 + (100 if r not in collect else 0)})
               for r, x in enumerate(inputs)]
    assert gather(outputs, collect, pad).batch["y"][:, 0].tolist() == [0, 10, 20, 30, 40, 50]


def test_cp_rank_nonzero_does_not_collect():
    assert chunk_index(ParallelLayout(world_size=2, cp=2)) == ([0, 0], [0])


def test_padding_for_inference_and_refusal_for_training():
    chunk, collect = chunk_index(ParallelLayout(world_size=4))
    inputs, pad = scatter(_rows(6), 4, chunk, pad=True)
    assert pad == 2 and [len(x) for x in inputs] == [2, 2, 2, 2]
    out = gather(inputs, collect, pad)
    assert out.batch["x"][:, 0].tolist() == [0, 1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="does not split evenly over 4"):
        scatter(_rows(6), 4, chunk, pad=False)


def test_rollout_replicas_tp2_of_world4():
    # vLLM TP 2 on 4 ranks: replicas {0, 1} and {2, 3}, headed by ranks 0 and 2.
    assert chunk_index(ParallelLayout(world_size=4, tp=2)) == ([0, 0, 1, 1], [0, 2])


def test_a_layout_that_does_not_fit_is_refused():
    with pytest.raises(ValueError, match="does not divide"):
        chunk_index(ParallelLayout(world_size=4, tp=3))


def test_balanced_partitions_equal_counts_and_tokens():
    lengths = [10, 1, 9, 2, 8, 3, 7, 4]
    groups = balanced_partitions(lengths, 2)
    assert sorted(i for g in groups for i in g) == list(range(8))
    assert [len(g) for g in groups] == [4, 4]
    sums = [sum(lengths[i] for i in g) for g in groups]
    assert sums == [22, 22]
    order = balance_order(lengths, 2)
    assert sorted(order) == list(range(8)) and set(order[:4]) == set(groups[0])
    # Sorted input would give 34 vs 10 if chunked naively.
    assert max(sums) - min(sums) < sum(sorted(lengths)[4:]) - sum(sorted(lengths)[:4])
