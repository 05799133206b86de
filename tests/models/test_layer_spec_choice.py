"""Which layer spec a model gets for megatron's `transformer_impl` (megarl.models.spec)."""

from __future__ import annotations

import pytest
import torch

from megarl.models.spec import resolve_transformer_impl

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


def test_local_is_always_local():
    for device in (CPU, CUDA):
        for te in (False, True):
            assert resolve_transformer_impl("local", device, te) == ("local", "")


def test_transformer_engine_on_cuda_with_te():
    assert resolve_transformer_impl("transformer_engine", CUDA, True) == ("transformer_engine", "")


@pytest.mark.parametrize("device, te, why", [(CPU, True, "CUDA only"), (CUDA, False, "not installed")])
def test_transformer_engine_falls_back_to_local_and_says_why(device, te, why):
    impl, reason = resolve_transformer_impl("transformer_engine", device, te)
    assert impl == "local" and why in reason


def test_unknown_impl_names_the_key():
    with pytest.raises(ValueError, match=r"override_transformer_config\.transformer_impl='inference_optimized'"):
        resolve_transformer_impl("inference_optimized", CUDA, True)
