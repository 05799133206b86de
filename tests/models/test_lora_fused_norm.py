"""LoRA on TE's fused layernorm + linear (megarl/models/lora.py): the adapter's input is the norm recomputed
from the module's own weights. Checked on CPU against torch's own rms_norm / layer_norm (TE's
``zero_centered_gamma`` stores gamma - 1), and the checkpointed pass (norm and A's matmul run again in backward)
against the plain one, gradients to x and A included. The module is a stand-in holding the attributes LoRA
reads of TE 2.20's ``LayerNormLinear`` (TE does not import on CPU); the GPU test against LoRA on megatron's
layers is tests/gpu/test_lora_te.py."""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from megarl.models.lora import _fused_norm, _normed_down


class TELayerNormColumnParallelLinear(torch.nn.Module):
    def __init__(self, hidden: int, normalization: str, zero_centered_gamma: bool) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.normalization, self.zero_centered_gamma, self.eps = normalization, zero_centered_gamma, 1e-5
        self.layer_norm_weight = torch.nn.Parameter(torch.randn(hidden, generator=g) * 0.1 + (0 if zero_centered_gamma else 1))
        self.layer_norm_bias = (torch.nn.Parameter(torch.randn(hidden, generator=g) * 0.1)
                                if normalization == "LayerNorm" else None)


@pytest.mark.parametrize("normalization, zero_centered", [("RMSNorm", False), ("RMSNorm", True), ("LayerNorm", False)])
def test_fused_norm_is_the_norm_te_applies(normalization, zero_centered):
    base = TELayerNormColumnParallelLinear(32, normalization, zero_centered)
    x = torch.randn(5, 2, 32, dtype=torch.float64)
    gamma = base.layer_norm_weight.double() + (1 if zero_centered else 0)
    if normalization == "RMSNorm":
        want = torch.nn.functional.rms_norm(x, (32,), gamma, base.eps)
    else:
        want = torch.nn.functional.layer_norm(x, (32,), gamma, base.layer_norm_bias.double(), base.eps)
    torch.testing.assert_close(_fused_norm(base, x.float()).double(), want, rtol=1e-5, atol=1e-6)


def test_checkpointed_down_projection_has_the_plain_gradients():
    base = TELayerNormColumnParallelLinear(32, "RMSNorm", False)
    x = torch.randn(5, 2, 32, requires_grad=True)
    a = torch.randn(4, 32, requires_grad=True)
    up = torch.randn(5, 2, 4)
    plain = (_normed_down(base, x, a) * up).sum()
    gx, ga = torch.autograd.grad(plain, (x, a))
    again = (checkpoint(_normed_down, base, x, a, use_reentrant=False) * up).sum()
    cx, ca = torch.autograd.grad(again, (x, a))
    torch.testing.assert_close(again, plain)
    torch.testing.assert_close(cx, gx)
    torch.testing.assert_close(ca, ga)
    assert gx.abs().max() > 0  # the gradient reaches x through the recomputed norm
