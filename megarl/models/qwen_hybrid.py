"""Qwen3.5 text (HF ``Qwen3_5ForCausalLM``, ``model_type`` ``qwen3_5_text``; its MoE variant ``Qwen3_5MoeForCausalLM``,
``qwen3_5_moe_text``) and Qwen3-Next (``Qwen3NextForCausalLM``, ``qwen3_next``) on megatron's local spec.

Their decoders interleave two layer kinds (``layer_types``; Qwen3-Next's checkpoints give
``full_attention_interval`` instead), each megatron-core's own module:

* ``linear_attention``: gated DeltaNet (megatron's ``GatedDeltaNet``: one input projection holding q, k, v, the
  output gate z and the beta / alpha gates, a causal depthwise convolution over q/k/v, the chunked gated delta
  rule, a gated RMSNorm and the output projection);
* ``full_attention``: attention with an output gate (``attention_output_gate``: q_proj holds each head's query
  and its gate), q/k RMSNorm and rotary embedding on the first ``partial_rotary_factor`` of each head.

Qwen3-Next's and Qwen3.5-MoE's MLPs are MoE (experts, a shared expert with a sigmoid gate: :mod:`megarl.models.moe_config`),
and its checkpoints hold the DeltaNet's input projections grouped by key head (``in_proj_qkvz``, ``in_proj_ba``)
where Qwen3.5's hold them apart (``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``): the converters
map both into megatron's one ``in_proj``. Every RMSNorm but the DeltaNet's gated one scales by ``1 + weight`` (:class:`megarl.models.gemma3.ZeroCenteredRMSNorm`).
megatron-core builds these hybrids only with transformer-engine's layer spec
(``experimental_attention_variant_module_specs``), so this module builds the same layers from megatron's local
modules; the DeltaNet kernels are flash-linear-attention's (fla) where it is installed, on CPU torch versions
(:mod:`megarl.compat.megatron_core.gdn_torch`). megatron's GatedDeltaNet takes no padding mask: rows must have
their padding after their tokens, or be packed (megarl's workers do both).
"""

from __future__ import annotations

import copy
from typing import Any, Optional

import torch
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig

__all__ = ["QWEN_HYBRID_MODEL_TYPES", "check_qwen_hybrid_supported", "qwen_hybrid_block", "qwen_hybrid_transformer_kwargs",
           "require_gdn_kernels"]

QWEN_HYBRID_MODEL_TYPES = ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next")
_LAYER_TYPES = ("linear_attention", "full_attention")
_WHERE = "(actor_rollout_ref.model.path config.json)"
LINEAR_FIELDS = ("linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
                 "linear_num_value_heads")


def layer_types(hf_config) -> list[str] | None:
    """Each layer's kind (:func:`megarl.config.rules.model.hybrid_layer_types` of the config's fields)."""
    from megarl.config.rules.model import hybrid_layer_types

    return hybrid_layer_types(vars(hf_config))


def check_qwen_hybrid_supported(hf_config) -> None:
    """Refuse the Qwen3.5 / Qwen3-Next options megarl does not build, naming the config.json field (raw config.json
    too)."""
    model_type = hf_config.model_type
    types = layer_types(hf_config)
    if not types or len(types) != hf_config.num_hidden_layers or set(types) - set(_LAYER_TYPES):
        raise ValueError(f"{model_type} layer_types {types} {_WHERE}: one of {_LAYER_TYPES} per layer is needed")
    missing = [f for f in LINEAR_FIELDS if not getattr(hf_config, f, None)]
    if missing:
        raise ValueError(f"{model_type} config.json lacks {', '.join(missing)} {_WHERE} (the gated DeltaNet's sizes)")
    if getattr(hf_config, "attention_bias", False):
        raise ValueError(f"{model_type} attention_bias=true {_WHERE} is not supported")


def qwen_hybrid_transformer_kwargs(hf_config) -> dict[str, Any]:
    """TransformerConfig fields of Qwen3.5's hybrid layers (on top of megarl's Llama-like base; the partial rotary
    comes with the rope fields)."""
    return dict(
        qk_layernorm=True,
        attention_output_gate=True,
        experimental_attention_variant="gated_delta_net",
        linear_attention_freq=[int(t == "linear_attention") for t in layer_types(hf_config)],
        **{field: int(getattr(hf_config, field)) for field in LINEAR_FIELDS},
    )


def require_gdn_kernels(device: torch.device) -> None:
    """fla's kernels on CUDA, the torch ones on CPU; ValueError naming the package on CUDA without fla."""
    from megatron.core.ssm.gated_delta_net import common

    if device.type == "cpu":
        from megarl.compat.megatron_core.gdn_torch import use_torch_gdn_kernels

        use_torch_gdn_kernels()
    elif not common.HAVE_FLA:
        raise ValueError("gated DeltaNet layers need flash-linear-attention's kernels on CUDA "
                         "(pip install flash-linear-attention); it is not installed")


def _attention_layer(config: TransformerConfig, moe: bool) -> ModuleSpec:
    from megarl.models.gemma3 import ZeroCenteredRMSNorm
    from megarl.models.spec import get_layer_spec

    spec = copy.deepcopy(get_layer_spec(config, use_te=False, num_experts=config.num_moe_experts if moe else None))
    layer = spec.submodules
    layer.input_layernorm = ZeroCenteredRMSNorm
    layer.pre_mlp_layernorm = ZeroCenteredRMSNorm
    layer.self_attention.submodules.q_layernorm = ZeroCenteredRMSNorm
    layer.self_attention.submodules.k_layernorm = ZeroCenteredRMSNorm
    return spec


def _linear_attention_layer(config: TransformerConfig, moe: bool) -> ModuleSpec:
    from megatron.core.ssm.gated_delta_net import GatedDeltaNet, GatedDeltaNetSubmodules
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    from megarl.models.spec import SequenceParallelTorchNorm

    spec = _attention_layer(config, moe)
    spec.submodules.self_attention = ModuleSpec(
        module=GatedDeltaNet,
        submodules=GatedDeltaNetSubmodules(in_proj=ColumnParallelLinear, out_norm=SequenceParallelTorchNorm,
                                           out_proj=RowParallelLinear),
    )
    return spec


def qwen_hybrid_block(config: TransformerConfig, vp_stage: Optional[int]):
    """The decoder block of one (virtual) pipeline stage: each layer's spec by ``linear_attention_freq`` and, for an
    MoE model, ``moe_layer_freq``."""
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    from megarl.models.gemma3 import ZeroCenteredRMSNorm
    from megarl.models.spec import moe_pattern, stage_layers

    layers = config.num_layers
    moe = moe_pattern(config) or [int(bool(config.num_moe_experts))] * layers
    specs = {(linear, is_moe): (_linear_attention_layer if linear else _attention_layer)(config, bool(is_moe))
             for linear, is_moe in set(zip(config.linear_attention_freq, moe))}
    return TransformerBlockSubmodules(
        layer_specs=[specs[config.linear_attention_freq[layer], moe[layer]] for layer in stage_layers(config, vp_stage)],
        layer_norm=ZeroCenteredRMSNorm)
