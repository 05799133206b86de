"""`views_of_unsharded` (the direct weight sync's TP=1 source) against `from_shards` (the export,
checked against HF checkpoints elsewhere): same elements in the same order, and views of the
parameter itself (no copy)."""

from __future__ import annotations

import pytest
import torch

from megarl.models.converters.transforms import Dims, from_shards, views_of_unsharded

DIMS = Dims(num_heads=8, num_query_groups=2, head_dim=4, vocab_size=30)


@pytest.mark.parametrize("kind,shape", [("replicated", (16,)), ("split0", (12, 16)), ("split1", (16, 12)),
                                        ("vocab", (32, 16)), ("gate_up", (24, 16)), ("qkv", (2 * (4 + 2) * 4, 16)),
                                        ("qkv", (2 * (4 + 2) * 4,))])
def test_views_hold_the_exported_tensors_without_copies(kind, shape):
    param = torch.randn(shape)
    want = from_shards(kind, [param], DIMS)
    got = views_of_unsharded(kind, param, DIMS)
    assert len(got) == len(want)
    for view, full in zip(got, want):
        assert view.untyped_storage().data_ptr() == param.untyped_storage().data_ptr()
        assert torch.equal(view.reshape(full.shape), full)
        dest = torch.empty_like(full)
        dest.view(view.shape).copy_(view)  # how the direct sync consumes them
        assert torch.equal(dest, full)
