"""Transformer layer specs: transformer-engine, or megatron-core local modules + SDPA.

Which one a model gets is megatron's own ``TransformerConfig.transformer_impl``, set
through ``megatron.override_transformer_config.transformer_impl`` (verl passes that dict
to TransformerConfig too): ``transformer_engine`` (megatron's default) or ``local``.
``transformer_engine`` falls back to ``local`` where TE cannot run (CPU, or CUDA without
transformer-engine installed; see :func:`resolve_transformer_impl`). With TE's fused RoPE and
weight-gradient accumulation (on where its spec runs: :mod:`megarl.models.config`), TE packed
(verl's default layout) is the fastest TE layout and equals SDPA padded on RL-shaped batches
(benchmarks/RESULTS.md, issue 23); sequence parallelism runs on both (the local spec through
:class:`SequenceParallelTorchNorm`).

megatron's local ``DotProductAttention`` allocates its score buffer on CUDA and has no
packed-sequence or context-parallel support, so the local spec uses SDPA (:mod:`megarl.models.core_attention`;
context parallelism: :mod:`megarl.models.cp_attention`; the TE spec does its own).
"""

from __future__ import annotations

import copy
from typing import Optional

import torch
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_spec,
    get_gpt_layer_with_transformer_engine_spec,
)
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig

from megarl.models.core_attention import MLACoreAttention, SDPACoreAttention

__all__ = ["SequenceParallelTorchNorm", "get_layer_spec", "have_transformer_engine", "local_block",
           "moe_pattern", "resolve_transformer_impl", "stage_layers", "te_block"]

_IMPL_KEY = "megatron.override_transformer_config.transformer_impl"
TRANSFORMER_IMPLS = ("transformer_engine", "local")

def have_transformer_engine() -> bool:
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_transformer_impl(requested: str, device: torch.device, te_available: bool) -> tuple[str, str]:
    """The layer spec a model on ``device`` gets for ``TransformerConfig.transformer_impl``.

    Returns ``(impl, why)``: ``impl`` in :data:`TRANSFORMER_IMPLS`; ``why`` says, for a
    log line, why it differs from ``requested`` ("" when it does not).

    Raises:
        ValueError: ``requested`` is not one of :data:`TRANSFORMER_IMPLS`.
    """
    if requested not in TRANSFORMER_IMPLS:
        raise ValueError(
            f"{_IMPL_KEY}={requested!r} is not supported; choose one of {', '.join(TRANSFORMER_IMPLS)}"
        )
    if requested == "local":
        return "local", ""
    if device.type != "cuda":
        return "local", f"transformer-engine runs on CUDA only (device {device.type})"
    if not te_available:
        return "local", f"transformer-engine is not installed (set {_IMPL_KEY}=local to silence this)"
    return "transformer_engine", ""


def get_layer_spec(
    config: TransformerConfig, *, use_te: bool, num_experts: Optional[int] = None
) -> ModuleSpec:
    """GPT decoder layer spec for ``config``.

    Args:
        config: the model's TransformerConfig (reads ``qk_layernorm``,
            ``moe_grouped_gemm``, ``multi_latent_attention``, ``normalization``).
        use_te: transformer-engine spec (CUDA with TE installed) instead of the local
            spec with :class:`SDPACoreAttention`.
        num_experts: experts per MoE layer, ``None`` for dense models.
    """
    if use_te:
        return get_gpt_layer_with_transformer_engine_spec(
            num_experts=num_experts,
            moe_grouped_gemm=config.moe_grouped_gemm,
            qk_layernorm=config.qk_layernorm,
        )
    spec = get_gpt_layer_local_spec(
        num_experts=num_experts,
        moe_grouped_gemm=config.moe_grouped_gemm,
        qk_layernorm=config.qk_layernorm,
        multi_latent_attention=config.multi_latent_attention,
        normalization=config.normalization,
    )
    core = MLACoreAttention if config.multi_latent_attention else SDPACoreAttention
    spec.submodules.self_attention.submodules.core_attention = core
    _swap_norms(spec)
    return spec


class SequenceParallelTorchNorm:
    """megatron's torch norm (``WrappedTorchNorm``: torch ``RMSNorm`` / ``LayerNorm``) that also
    runs under sequence parallelism, as TE's norms do. A norm is per token, so on a rank's
    sequence shard it computes exactly what it computes on the whole sequence; only its weight
    gradient comes from that shard, so the weight is marked ``sequence_parallel`` and megatron's
    ``finalize_model_grads`` all-reduces it over the TP group (what TE marks on its norms).
    ``WrappedTorchNorm`` refuses sequence parallelism because it does not mark them."""

    def __new__(cls, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, persist_layer_norm: bool = False,
                zero_centered_gamma: bool = False, normalization: str = "LayerNorm"):
        from megatron.core.transformer.torch_norm import WrappedTorchNorm

        plain = copy.copy(config)
        plain.sequence_parallel = False
        norm = WrappedTorchNorm(plain, hidden_size, eps, persist_layer_norm, zero_centered_gamma, normalization)
        for param in norm.parameters():
            setattr(param, "sequence_parallel", config.sequence_parallel)
        return norm


def _swap_norms(spec) -> None:
    """Every ``WrappedTorchNorm`` of a local layer spec -> :class:`SequenceParallelTorchNorm`."""
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    fields = vars(spec.submodules) if spec.submodules is not None and hasattr(spec.submodules, "__dict__") else {}
    for name, value in fields.items():
        if value is WrappedTorchNorm:
            setattr(spec.submodules, name, SequenceParallelTorchNorm)
        elif isinstance(value, ModuleSpec):
            _swap_norms(value)


def stage_layers(config: TransformerConfig, vp_stage: Optional[int]) -> range:
    """The global indices of the decoder layers one (virtual) pipeline stage builds."""
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    offset = get_transformer_layer_offset(config, vp_stage=vp_stage)
    return range(offset, offset + get_num_layers_to_build(config, vp_stage=vp_stage))


def local_block(layer_spec: ModuleSpec, config: TransformerConfig, vp_stage: Optional[int], final_norm=None):
    """The local spec's decoder block for one (virtual) pipeline stage: megatron builds the same
    from a layer spec, but with ``WrappedTorchNorm`` as the final norm. ``layer_spec`` is the
    MoE layer's spec of a MoE model; layers that ``config.moe_layer_freq`` marks dense get
    the dense spec. ``final_norm``: the final norm's module (default
    :class:`SequenceParallelTorchNorm`)."""
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    layers = stage_layers(config, vp_stage)
    pattern = moe_pattern(config)
    if pattern is None:
        specs = [layer_spec] * len(layers)
    else:
        dense = get_layer_spec(config, use_te=False, num_experts=None)
        specs = [layer_spec if pattern[layer] else dense for layer in layers]
    return TransformerBlockSubmodules(layer_specs=specs, layer_norm=final_norm or SequenceParallelTorchNorm)


def moe_pattern(config: TransformerConfig) -> Optional[list[int]]:
    """Per global layer 1 = MoE / 0 = dense for a MoE model with dense layers; None when every
    layer has the same spec (a dense model, or every layer MoE)."""
    freq = config.moe_layer_freq
    if not config.num_moe_experts or freq == 1:
        return None
    if isinstance(freq, int):
        return [int(i % freq == 0) for i in range(config.num_layers)]
    return list(freq)


def te_block(config: TransformerConfig, vp_stage: Optional[int]):
    """The transformer-engine decoder block of a MoE model with dense layers (megatron's own
    per-layer specs from ``moe_layer_freq``)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    return get_gpt_decoder_block_spec(config, use_transformer_engine=True, vp_stage=vp_stage)
