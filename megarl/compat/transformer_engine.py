"""Weight gradients accumulated by transformer-engine's wgrad GEMM straight into megatron DDP's
fp32 ``main_grad``, without apex.

megatron-core has one switch for this, ``TransformerConfig.gradient_accumulation_fusion``: TE's
linears read it (``fuse_wgrad_accumulation``), and so does megatron's own ``ColumnParallelLinear``
(the LM head, and every linear of the local spec), which then requires apex's
``fused_weight_gradient_mlp_cuda`` at construction. Without fusion every micro-batch writes a bf16
weight gradient and DDP's hook adds it into ``main_grad`` (``aten::add_``, ~9 % of a 7B-shape step
on one H100: benchmarks/RESULTS.md) after rounding it to bf16. So where apex is absent,
:func:`build_model <megarl.models.build_model>` builds with megatron's flag off and turns TE's own
flag on (:func:`fuse_te_wgrad_accumulation`); megatron's linears keep the hook's ``add_``.

TE then needs ``param.main_grad`` in backward: only models wrapped in megatron's
``DistributedDataParallel`` train (megarl's engine wraps every trainable one); forward-only models
(reference, log-probs) never read it.
"""

from __future__ import annotations

import functools

import torch

from megarl.compat.shim import Shim, source_has

__all__ = ["SHIMS", "apex_wgrad_kernel_available", "fuse_te_wgrad_accumulation"]

SHIMS = (
    Shim("transformer-engine modules' fuse_wgrad_accumulation", ("megatron-core==0.19.2", "transformer-engine==2.20.2"),
         ("gpu",),
         "megatron-core's one gradient_accumulation_fusion flag also makes its own ColumnParallelLinear require "
         "apex's fused_weight_gradient_mlp_cuda (tensor_parallel/layers.py): without apex megatron's flag is off "
         "and TE's own module attribute on (fuse_te_wgrad_accumulation)",
         source_has("megatron.core.tensor_parallel.layers", None, "fused_weight_gradient_mlp_cuda")),
)


@functools.cache
def apex_wgrad_kernel_available() -> bool:
    """apex's CUDA extension that megatron's own linears need for gradient accumulation fusion."""
    try:
        import fused_weight_gradient_mlp_cuda  # noqa: F401
    except ImportError:
        return False
    return True


def fuse_te_wgrad_accumulation(model: torch.nn.Module) -> int:
    """Turn on ``fuse_wgrad_accumulation`` in every transformer-engine module of ``model``
    (``Linear``, ``LayerNormLinear``, ``GroupedLinear``: the attribute their forward passes to the
    autograd function); returns how many."""
    from transformer_engine.pytorch.module.base import TransformerEngineBaseModule

    fused = 0
    for module in model.modules():
        if isinstance(module, TransformerEngineBaseModule) and hasattr(module, "fuse_wgrad_accumulation"):
            module.fuse_wgrad_accumulation = True
            fused += 1
    return fused
