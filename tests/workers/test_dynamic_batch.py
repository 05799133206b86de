"""Token-budget partitioner: budget respected, balanced, deterministic, order restored."""

import random

import pytest
import torch

from megarl.parallel.dynamic_batch import fixed_size_partitions, partition_by_token_budget, restore_order


def test_budget_coverage_and_determinism():
    rng = random.Random(0)
    lens = [rng.randint(1, 40) for _ in range(57)]
    parts = partition_by_token_budget(lens, 100)
    assert sorted(i for p in parts for i in p) == list(range(57))
    assert all(sum(lens[i] for i in p) <= 100 for p in parts)
    assert partition_by_token_budget(lens, 100) == parts
    # Few micro-batches: within one of the lower bound ceil(total / budget) here.
    assert len(parts) <= -(-sum(lens) // 100) + 1


def test_balanced_hand_example():
    # 4 sequences, budget 10: total 16 -> 2 micro-batches, balanced 8 / 8.
    assert partition_by_token_budget([6, 2, 5, 3], 10) == [[0, 1], [2, 3]]


def test_min_micro_batches_and_too_long():
    assert len(partition_by_token_budget([1, 1, 1], 100, min_num_micro_batches=2)) == 2
    with pytest.raises(ValueError, match="ppo_max_token_len_per_gpu=5 .* row 1"):
        partition_by_token_budget([3, 9], 5)


def test_restore_order_roundtrip():
    lens = [5, 1, 4, 2, 3]
    data = torch.arange(5) * 10
    parts = partition_by_token_budget(lens, 6)
    outputs = [data[p] for p in parts]
    assert torch.equal(restore_order(outputs, parts), data)


def test_fixed_size():
    assert fixed_size_partitions(5, 2, "k") == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="k must be"):
        fixed_size_partitions(5, 0, "k")


def test_context_parallel_multiplies_the_token_budget():
    """verl: a micro-batch holds max_token_len x cp tokens, each CP rank computing 1/cp of them."""
    from megarl.workers.megatron.engine import MicroBatchSpec

    spec = MicroBatchSpec(None, True, 10, micro_batch_key="mb", max_token_len_key="budget")
    mask = torch.ones(4, 6, dtype=torch.long)  # 4 rows of 6 tokens
    assert sorted(len(p) for p in spec.partitions(mask)) == [1, 1, 1, 1]  # 12 > 10
    assert sorted(len(p) for p in spec.partitions(mask, cp_size=2)) == [2, 2]  # budget 20: 2 rows each
