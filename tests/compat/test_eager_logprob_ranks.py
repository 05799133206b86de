"""megarl.compat.vllm.eager_logprob_ranks: vLLM's sampler counts log-prob ranks eagerly on CPU, with the counts
of the compiled function's formula (checked here by hand, entry by entry)."""

from __future__ import annotations

import torch

from megarl.compat.vllm.eager_logprob_ranks import _count_at_least, eager_logprob_ranks_on_cpu


def test_counts_equal_a_hand_count_ties_included():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-5, 5, (6, 40), generator=g).float()  # many ties: ">=" counts them
    values = x[:, 7:8].clone()
    want = [sum(1 for v in row.tolist() if v >= row_value) for row, row_value in zip(x, values[:, 0].tolist())]
    assert _count_at_least(x, values).tolist() == want


def test_the_sampler_takes_the_eager_count_on_cpu():
    from vllm.v1.sample import sampler

    eager_logprob_ranks_on_cpu()
    assert sampler.batched_count_greater_than is _count_at_least
