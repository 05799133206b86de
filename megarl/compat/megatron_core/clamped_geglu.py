"""GPT-OSS's clamped GEGLU and megatron-core's fused kernel for it.

megatron-core's ``weighted_bias_quick_geglu_impl`` (taken on CUDA where ``bias_activation_fusion`` is on)
clamps its input and then adds the bias; HF's GptOssExperts clamps ``gate_up + bias``. The fused path is
exact only where fc1's bias is already in its input: TEGroupedMLP adds it in its grouped GEMM
(``skip_bias_add=False``), SequentialMLP's MLP hands it to the kernel separately (``skip_bias_add=True``).
"""

from __future__ import annotations

from megarl.compat.shim import Shim, source_has

__all__ = ["SHIMS", "fused_clamped_geglu_is_exact"]

SHIMS = (
    Shim("bias_activation_fusion off for GPT-OSS's SequentialMLP experts", ("megatron-core==0.19.2",), ("gpu",),
         "fusions/fused_bias_geglu.py weighted_bias_quick_geglu_impl clamps the input before "
         "WeightedBiasQuickGeGLUFunction adds the bias (HF: clamp after the bias); "
         "tests/models/test_gpt_oss.py::test_megatron_fused_clamped_geglu_clamps_before_the_bias",
         source_has("megatron.core.fusions.fused_bias_geglu", "weighted_bias_quick_geglu_impl",
                    "x_glu.clamp(min=None, max=clamp_value)")),
)


def fused_clamped_geglu_is_exact(grouped_gemm: bool) -> bool:
    """Whether megatron's fused bias + clamped GEGLU computes HF's activation for these experts: only
    where fc1's bias is added in the GEMM (grouped experts)."""
    return grouped_gemm
