"""Per-phase memory is the largest over the world's ranks: the metrics come back from the last pipeline
stage's rank, which under 1F1B is not the one holding the most activations."""

from __future__ import annotations

from helpers.dist_utils import run_distributed

from megarl.utils.gpu_memory import max_over_world


def _ranks_values() -> list[float]:
    import os

    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    return max_over_world([float(rank), 10.0 - rank], "cpu")


def test_each_value_is_the_largest_over_the_ranks():
    assert run_distributed(_ranks_values, 2, timeout=120) == [[1.0, 10.0], [1.0, 10.0]]


def test_without_a_process_group_the_values_stay():
    assert max_over_world([3.0, 4.0], "cpu") == [3.0, 4.0]
