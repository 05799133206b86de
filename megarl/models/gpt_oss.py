"""GPT-OSS (HF ``GptOssForCausalLM``, ``model_type`` ``gpt_oss``) as megatron-core's GPTModel.

Every piece is megatron-core's own (what Megatron-Bridge 0.6.2's GPT-OSS provider sets, checked against
it in ``tests/models/test_gpt_oss.py``); this module only reads them from the HF config:

* attention sinks: ``softmax_type="learnable"``, one logit per head in every query's softmax
  (``core_attention.softmax_offset``; megarl's local spec: :class:`megarl.models.core_attention.SDPACoreAttention`);
* sliding-window layers from ``layer_types`` (``window_size`` / ``window_attn_skip_freq``), biases on q/k/v/o;
* YaRN rotary (``position_embedding_type="yarn"`` and its ``yarn_*`` fields, which megatron's GPTModel reads
  from the config: :class:`YarnTransformerConfig`);
* MoE in every layer with biases on the router and the experts (``add_bias_linear``); top-k then softmax over
  the k; the experts' clamped GLU ``quick_gelu(min(gate, limit)) * (clamp(up, -limit, limit) + 1)``
  (``activation_func_clamp_value``, ``glu_linear_offset``; quick-GELU's 1.702 is HF's ``swiglu_alpha``).

HF keeps each layer's experts in one tensor (``mlp.experts.gate_up_proj`` ``[E, hidden, 2 * I]`` with gate and
up interleaved along the last dim, ``down_proj`` ``[E, I, hidden]``, their biases ``[E, 2 * I]`` / ``[E, hidden]``);
the converters slice it per expert (``megarl.models.converters``). MXFP4 checkpoints (openai/gpt-oss-*
as published) are refused: dequantize them to bf16 first, as verl's GPT-OSS recipe does.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch
from megatron.core.transformer.transformer_config import TransformerConfig

__all__ = ["GPT_OSS_MODEL_TYPES", "YarnTransformerConfig", "check_gpt_oss_supported", "gpt_oss_rope_kwargs",
           "gpt_oss_transformer_kwargs"]

GPT_OSS_MODEL_TYPES = ("gpt_oss",)
_LAYER_TYPES = ("sliding_attention", "full_attention")
_QUICK_GELU_ALPHA = 1.702  # megatron's quick_gelu: y * sigmoid(1.702 * y)
# transformers' GptOssConfig defaults, for a config.json without rope_scaling / rope_parameters
_DEFAULT_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                 "original_max_position_embeddings": 4096, "rope_theta": 150000.0}
_WHERE = "(actor_rollout_ref.model.path config.json)"


@dataclasses.dataclass
class YarnTransformerConfig(TransformerConfig):
    """TransformerConfig with the YaRN fields megatron-core 0.19's GPTModel and attention read by ``getattr``
    (Megatron-Bridge declares them on its GPTModelProvider)."""

    yarn_rotary_scaling_factor: float = 1.0
    yarn_original_max_position_embeddings: int = 4096
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_mscale: Optional[float] = None
    yarn_mscale_all_dim: Optional[float] = None
    yarn_correction_range_round_to_int: bool = True


def _rope(hf_config) -> dict[str, Any]:
    params = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None)
    rope = dict(params) if params else {**_DEFAULT_ROPE}
    rope.setdefault("rope_theta", getattr(hf_config, "rope_theta", None) or _DEFAULT_ROPE["rope_theta"])
    rope.setdefault("rope_type", rope.get("type", "default"))
    return rope


def _layer_types(hf_config) -> list[str]:
    types = getattr(hf_config, "layer_types", None)
    if types is None:  # transformers' default: sliding on even layers
        return [_LAYER_TYPES[i % 2] for i in range(hf_config.num_hidden_layers)]
    return list(types)


def check_gpt_oss_supported(hf_config) -> None:
    """Refuse the GPT-OSS options megarl does not build, naming the config.json field. Reads the raw
    config.json too (the preflight), so every field falls back to transformers' default."""
    quant = getattr(hf_config, "quantization_config", None)
    if quant:
        method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", quant)
        raise ValueError(f"gpt_oss quantization_config (quant_method {method!r}) {_WHERE} is not supported: megarl "
                         "trains bf16 weights; dequantize the checkpoint first (transformers: from_pretrained with "
                         "quantization_config=Mxfp4Config(dequantize=True), then save_pretrained), as verl's GPT-OSS "
                         "recipe does")
    alpha = float(getattr(hf_config, "swiglu_alpha", _QUICK_GELU_ALPHA))
    if alpha != _QUICK_GELU_ALPHA:
        raise ValueError(f"gpt_oss swiglu_alpha={alpha} {_WHERE} is not supported (megatron's quick-GELU has "
                         f"{_QUICK_GELU_ALPHA})")
    types = _layer_types(hf_config)
    unknown = sorted(set(types) - set(_LAYER_TYPES))
    if unknown or len(types) != hf_config.num_hidden_layers:
        raise ValueError(f"gpt_oss layer_types {types} {_WHERE}: one of {_LAYER_TYPES} per layer is supported")
    if "sliding_attention" in types and not getattr(hf_config, "sliding_window", None):
        raise ValueError(f"gpt_oss sliding_attention layers without sliding_window {_WHERE}")
    if not getattr(hf_config, "attention_bias", True):
        raise ValueError(f"gpt_oss attention_bias=false {_WHERE} is not supported (GPT-OSS biases q/k/v/o)")
    rope = _rope(hf_config)
    if rope["rope_type"] not in ("yarn", "default"):
        raise ValueError(f"gpt_oss rope {rope} {_WHERE} is not supported (yarn or default)")
    if rope.get("attention_factor") is not None:
        raise ValueError(f"gpt_oss rope attention_factor={rope['attention_factor']} {_WHERE} is not supported "
                         "(megatron derives it from factor, mscale and mscale_all_dim)")
    if rope["rope_type"] == "yarn" and not rope.get("factor"):
        raise ValueError(f"gpt_oss yarn rope without factor {_WHERE} is not supported")


def gpt_oss_rope_kwargs(hf_config) -> dict[str, Any]:
    """GPTModel rotary arguments (YaRN's own fields are config fields: :func:`gpt_oss_transformer_kwargs`)."""
    rope = _rope(hf_config)
    return {"position_embedding_type": "yarn" if rope["rope_type"] == "yarn" else "rope",
            "rotary_base": float(rope["rope_theta"]), "rope_scaling": False}


def _eager_quick_gelu(y: torch.Tensor) -> torch.Tensor:
    """megatron's ``quick_gelu`` without its torch.compile (CPU: no inductor build per process)."""
    return y * torch.sigmoid(_QUICK_GELU_ALPHA * y)


def gpt_oss_transformer_kwargs(hf_config, *, on_cpu: bool, grouped_gemm: bool) -> dict[str, Any]:
    """TransformerConfig fields of GPT-OSS (on top of megarl's Llama-like base and the MoE fields)."""
    from megatron.core.fusions.fused_bias_geglu import quick_gelu

    from megarl.compat.megatron_core.clamped_geglu import fused_clamped_geglu_is_exact

    rope = _rope(hf_config)
    types = _layer_types(hf_config)
    kwargs: dict[str, Any] = dict(
        add_bias_linear=True,
        add_qkv_bias=True,
        softmax_type="learnable",
        # HF: query i sees keys i - sliding_window + 1 .. i; megatron: (keys left of i, keys right of i)
        window_size=(int(hf_config.sliding_window) - 1, 0) if "sliding_attention" in types else None,
        window_attn_skip_freq=[int(t == "sliding_attention") for t in types],
        # megatron's own quick_gelu on CUDA: its fused bias + clamped GEGLU kernel is chosen by identity
        activation_func=_eager_quick_gelu if on_cpu else quick_gelu,
        bias_activation_fusion=not on_cpu and fused_clamped_geglu_is_exact(grouped_gemm),
        activation_func_clamp_value=float(getattr(hf_config, "swiglu_limit", 7.0)),
        glu_linear_offset=1.0,
        apply_rope_fusion=False,  # TE's fused RoPE has no YaRN attention factor (mscale)
    )
    if rope["rope_type"] == "yarn":
        mscale, mscale_all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
        kwargs.update(
            yarn_rotary_scaling_factor=float(rope["factor"]),
            yarn_original_max_position_embeddings=int(rope.get("original_max_position_embeddings")
                                                      or hf_config.max_position_embeddings),
            yarn_beta_fast=float(rope.get("beta_fast", 32.0)),
            yarn_beta_slow=float(rope.get("beta_slow", 1.0)),
            # HF: mscale / mscale_all_dim only when both are set (else 0.1 ln(factor) + 1), as megatron
            yarn_mscale=float(mscale) if mscale and mscale_all_dim else None,
            yarn_mscale_all_dim=float(mscale_all_dim) if mscale and mscale_all_dim else None,
            yarn_correction_range_round_to_int=bool(rope.get("truncate", True)),
        )
    return kwargs

