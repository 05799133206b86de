"""HF ``PretrainedConfig`` -> megatron ``TransformerConfig`` (+ GPTModel arguments).

Supported ``model_type``: llama, mistral (no sliding window), qwen2 (QKV bias), qwen3
(QK RMSNorm), and the MoE families of :mod:`megarl.models.moe_config`: mixtral, qwen2_moe
(shared expert with gate), qwen3_moe (softmax top-k routers, dense first layers, load-balancing
loss per the HF config), glm4_moe (GLM-4.5: partial rotary embedding, sigmoid router with
score-correction bias, shared experts), deepseek_v3 (the same MoE, multi-latent attention of
:mod:`megarl.models.mla_config`), hy_v3 (Hy3: QK norm, DeepSeek-V3's routing without groups:
:mod:`megarl.models.hy_v3`), gpt_oss (attention sinks, YaRN, biased MoE: :mod:`megarl.models.gpt_oss`),
qwen3_5_text, qwen3_5_moe_text and qwen3_next (gated DeltaNet and gated attention: :mod:`megarl.models.qwen_hybrid`),
nemotron_h (Mamba-2, attention, MLP and MoE layers: :mod:`megarl.models.nemotron_h`).
Not supported yet, refused with the reason: see :data:`NOT_YET_SUPPORTED`. gemma3_text (Gemma 3 text): :mod:`megarl.models.gemma3`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

from megarl.compat.megatron_core.cpu import cpu_transformer_settings
from megarl.config.rules.engines import FLASH_ATTN_MODULES, attention_backend_that_runs
from megarl.config.rules.view import has_module
from megarl.models.gemma3 import (
    GEMMA3_MODEL_TYPES,
    check_gemma3_supported,
    gemma3_rope_kwargs,
    gemma3_transformer_kwargs,
)
from megarl.models.gpt_oss import (
    GPT_OSS_MODEL_TYPES,
    YarnTransformerConfig,
    check_gpt_oss_supported,
    gpt_oss_rope_kwargs,
    gpt_oss_transformer_kwargs,
)
from megarl.models.qwen_hybrid import QWEN_HYBRID_MODEL_TYPES, check_qwen_hybrid_supported, qwen_hybrid_transformer_kwargs
from megarl.models.mla_config import MLA_MODEL_TYPES, check_mla_supported, mla_transformer_kwargs
from megarl.models.moe_config import MOE_MODEL_TYPES, check_moe_supported, moe_transformer_kwargs
from megarl.models.nemotron_h import NEMOTRON_H_MODEL_TYPES, check_nemotron_h_supported, nemotron_h_transformer_kwargs
from megarl.models.spec import have_transformer_engine, resolve_transformer_impl
from megarl.parallel.layout import ParallelLayout

__all__ = [
    "SUPPORTED_MODEL_TYPES", "hf_to_transformer_config", "gpt_model_kwargs", "padded_vocab_size", "unsupported_reason",
]

SUPPORTED_MODEL_TYPES = tuple(dict.fromkeys(("llama", "mistral", "qwen2", "qwen3", *GEMMA3_MODEL_TYPES,
                                             *QWEN_HYBRID_MODEL_TYPES, *MOE_MODEL_TYPES)))
# built on megatron's local layer spec whatever transformer_impl asks (their layers are megarl's: see each module)
LOCAL_SPEC_ONLY = {**{t: "Gemma 3's sandwich norms and per-layer rotary are in megarl's local spec only" for t in GEMMA3_MODEL_TYPES},
                   **{t: "megatron-core builds gated DeltaNet hybrids with TE's fused norm-linears only, whose names "
                         "and layouts megarl's converters do not map" for t in QWEN_HYBRID_MODEL_TYPES},
                   **{t: "megatron-core builds Mamba hybrids (HybridModel) with TE's fused norm-linears only, whose "
                         "names and layouts megarl's converters do not map" for t in NEMOTRON_H_MODEL_TYPES}}
# model_type -> why megarl refuses it
NOT_YET_SUPPORTED = {
    "gemma3": "it is Gemma 3's vision-language model (a SigLIP vision tower megarl does not build); "
              "its text-only checkpoints (Gemma3ForCausalLM, model_type gemma3_text) are supported",
}
_DTYPE_FLAGS = {torch.float32: {}, torch.bfloat16: {"bf16": True}, torch.float16: {"fp16": True}}


def _check_supported(hf_config) -> str:
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        why = f" ({NOT_YET_SUPPORTED[model_type]})" if model_type in NOT_YET_SUPPORTED else ""
        raise ValueError(
            f"model_type {model_type!r} (actor_rollout_ref.model.path config.json) is not "
            f"supported{why}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    if model_type in GEMMA3_MODEL_TYPES:
        check_gemma3_supported(hf_config)
    elif model_type in GPT_OSS_MODEL_TYPES:
        check_gpt_oss_supported(hf_config)  # its hidden_act is unused: the experts' GLU is its own
    elif getattr(hf_config, "hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {hf_config.hidden_act!r} is not supported (only silu)")
    if model_type == "mistral" and getattr(hf_config, "sliding_window", None):
        raise ValueError("mistral sliding_window attention is not supported; set it to null")
    if model_type == "mixtral" and getattr(hf_config, "sliding_window", None):
        raise ValueError("mixtral sliding_window attention is not supported; set it to null")
    if model_type in NEMOTRON_H_MODEL_TYPES:  # before the MoE checks: they read its layer pattern
        check_nemotron_h_supported(hf_config)
    if model_type in MOE_MODEL_TYPES:
        check_moe_supported(hf_config)
    if model_type in QWEN_HYBRID_MODEL_TYPES:
        check_qwen_hybrid_supported(hf_config)
    return model_type


def _rope_kwargs(hf_config) -> dict[str, Any]:
    # transformers >= 5 keeps theta and scaling in `rope_parameters`; 4.x in
    # `rope_theta` / `rope_scaling`.
    params = dict(getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    kwargs: dict[str, Any] = {"rotary_base": float(theta), "rope_scaling": False}
    # GLM-4.5 rotates the first `partial_rotary_factor` of each head's dims (megatron: rotary_percent)
    partial = float(params.get("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", 1.0)) or 1.0)
    if partial != 1.0:
        kwargs["rotary_percent"] = partial
    if rope_type == "default" or (rope_type == "yarn" and hf_config.model_type in MLA_MODEL_TYPES):
        return kwargs  # MLA: megatron's MLA layers build their own (YaRN) rotary, see mla_config
    if rope_type == "llama3" and (
        params.get("low_freq_factor", 1) == 1
        and params.get("high_freq_factor", 4) == 4
        and params.get("original_max_position_embeddings", 8192) == 8192
    ):
        return {**kwargs, "rope_scaling": True, "rope_scaling_factor": float(params["factor"])}
    raise ValueError(f"rope scaling {params!r} is not supported (default, or llama3 with 1/4/8192)")


def unsupported_reason(hf_config) -> str | None:
    """Why megarl cannot build the model of ``hf_config`` (its model_type, activation, sliding window,
    rope scaling, MoE layout), or None when it can; what the preflight reports before any worker starts."""
    try:
        if _check_supported(hf_config) not in GPT_OSS_MODEL_TYPES:  # GPT-OSS: its own YaRN rope
            _rope_kwargs(hf_config)
    except ValueError as exc:
        return str(exc)
    return None


def padded_vocab_size(vocab_size: int, tp_size: int) -> int:
    """Smallest multiple of ``tp_size`` >= ``vocab_size`` (megatron splits the vocab evenly).

    Rows past ``vocab_size`` exist only in megatron; their logits are masked by the
    model (see ``megarl.models.build_model``) and they are never exported.
    """
    return -(-vocab_size // tp_size) * tp_size


def gpt_model_kwargs(hf_config, *, value_head: bool = False) -> dict[str, Any]:
    """GPTModel constructor arguments that come from the HF config (not the layer config)."""
    tp = parallel_state.get_tensor_model_parallel_world_size()
    return {
        "vocab_size": padded_vocab_size(hf_config.vocab_size, tp),
        "max_sequence_length": hf_config.max_position_embeddings,
        # A critic has its own value head; the LM head is never tied there.
        "share_embeddings_and_output_weights": bool(getattr(hf_config, "tie_word_embeddings", False))
        and not value_head,
        **_model_rope_kwargs(hf_config),
    }


def _model_rope_kwargs(hf_config) -> dict[str, Any]:
    if hf_config.model_type in GEMMA3_MODEL_TYPES:
        return {"position_embedding_type": "rope", **gemma3_rope_kwargs(hf_config)}
    if hf_config.model_type in GPT_OSS_MODEL_TYPES:
        return gpt_oss_rope_kwargs(hf_config)
    if hf_config.model_type in NEMOTRON_H_MODEL_TYPES:
        return {"position_embedding_type": "none"}  # its attention has no positional embedding
    return {"position_embedding_type": "rope", **_rope_kwargs(hf_config)}


def _plain(value):
    """An omegaconf container as plain dicts / lists (a TransformerConfig must pickle); else ``value``."""
    if hasattr(value, "_metadata"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    return value


def transformer_overrides(overrides) -> dict[str, Any]:
    """``megatron.override_transformer_config`` as TransformerConfig keyword arguments: plain
    values (omegaconf lists inside a plain dict too: a TransformerConfig must pickle), known fields only,
    and verl's ``attention_backend: flash`` as Megatron's enum (a string compares unequal to every
    ``AttnBackend`` member, so it would do nothing)."""
    overrides = {name: _plain(value) for name, value in dict(_plain(overrides)).items()}
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(TransformerConfig)})
    if unknown:
        raise ValueError(f"megatron.override_transformer_config has unknown TransformerConfig fields: {unknown}")
    if isinstance(overrides.get("attention_backend"), str):
        from megatron.core.transformer.enums import AttnBackend

        overrides["attention_backend"] = AttnBackend[overrides["attention_backend"]]
    return overrides


def hf_to_transformer_config(
    hf_config,
    megatron_cfg: Mapping[str, Any] | None,
    *,
    device: str | torch.device,
    dtype: torch.dtype,
) -> TransformerConfig:
    """Megatron TransformerConfig for ``hf_config`` under the current parallel state.

    Parallel sizes come from ``megatron.core.parallel_state`` (set by
    ``megarl.parallel.init_distributed``); ``megatron_cfg.sequence_parallel`` and
    ``megatron_cfg.override_transformer_config`` (a dict of TransformerConfig fields,
    applied last) are read from the verl-style ``megatron`` node.

    Raises:
        ValueError: unsupported architecture, or an unknown override key.
    """
    model_type = _check_supported(hf_config)
    megatron_cfg = megatron_cfg if megatron_cfg is not None else {}
    on_cpu = torch.device(device).type == "cpu"
    if dtype not in _DTYPE_FLAGS:
        raise ValueError(f"dtype {dtype} is not supported (float32, bfloat16, float16)")
    overrides = transformer_overrides(megatron_cfg.get("override_transformer_config", None) or {})
    # Grouped GEMM where the transformer-engine spec runs (TEGroupedMLP, whose per-expert
    # weights megarl's converters map); megatron's local GroupedMLP keeps all experts in one
    # tensor that they do not.
    impl = overrides.get("transformer_impl", "transformer_engine")
    resolved_impl = resolve_transformer_impl(impl, torch.device(device), have_transformer_engine())[0]
    grouped_gemm = resolved_impl != "local" and model_type not in LOCAL_SPEC_ONLY
    # TE's fused kernels where its spec runs (Gemma 3 builds the local spec whatever is asked):
    # RoPE in one kernel, packed sequences included (megatron's unfused THD RoPE syncs the host
    # and slices per sequence, twice per layer), and weight gradients accumulated by the wgrad
    # GEMM into DDP's fp32 main_grad (no bf16 wgrad + add_ per micro-batch; see megarl.compat.transformer_engine).
    te_kernels = resolved_impl == "transformer_engine" and model_type not in LOCAL_SPEC_ONLY
    backend = overrides.get("attention_backend")
    if backend is not None:  # verl's flash without flash-attn: TE's fused attention (the driver printed why)
        runs = attention_backend_that_runs(backend.name, te_runs=te_kernels,
                                           has_flash=any(has_module(m) for m in FLASH_ATTN_MODULES))
        overrides["attention_backend"] = type(backend)[runs]
    if model_type in MLA_MODEL_TYPES:
        check_mla_supported(hf_config, resolved_impl)
    if overrides.get("moe_grouped_gemm") and not grouped_gemm:
        raise ValueError(
            "megatron.override_transformer_config.moe_grouped_gemm=true needs the transformer-engine layer "
            "spec (CUDA with transformer-engine); remove it: megarl turns grouped GEMM on where that spec runs"
        )
    num_heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads

    kwargs: dict[str, Any] = dict(
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        ffn_hidden_size=hf_config.intermediate_size,
        num_attention_heads=num_heads,
        num_query_groups=getattr(hf_config, "num_key_value_heads", None) or num_heads,
        kv_channels=head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=(hf_config.layer_norm_epsilon if model_type in NEMOTRON_H_MODEL_TYPES
                           else hf_config.rms_norm_eps),
        activation_func=F.silu,
        gated_linear_unit=True,
        add_bias_linear=False,
        add_qkv_bias=_qkv_bias(hf_config),
        qk_layernorm=_qk_norm(hf_config),
        hidden_dropout=float(getattr(hf_config, "hidden_dropout", 0.0)),
        attention_dropout=float(getattr(hf_config, "attention_dropout", 0.0)),
        init_method_std=float(getattr(hf_config, "initializer_range", 0.02)),
        params_dtype=dtype,
        pipeline_dtype=dtype,
        **_DTYPE_FLAGS[dtype],
        # bias_activation_fusion, use_cpu_initialization: by device (megarl.compat.megatron_core.cpu)
        **cpu_transformer_settings(on_cpu),
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=te_kernels and model_type not in MLA_MODEL_TYPES,
        gradient_accumulation_fusion=te_kernels,
        persist_layer_norm=False,
        **ParallelLayout.from_parallel_state().megatron_sizes(),
        sequence_parallel=bool(megatron_cfg.get("sequence_parallel", False)),
    )
    if kwargs["sequence_parallel"] and kwargs["tensor_model_parallel_size"] == 1:
        kwargs["sequence_parallel"] = False

    if model_type in MOE_MODEL_TYPES:
        kwargs.update(moe_transformer_kwargs(hf_config, grouped_gemm=grouped_gemm, on_cpu=on_cpu))
    if model_type in MLA_MODEL_TYPES:
        kwargs.update(mla_transformer_kwargs(hf_config))
    if model_type in GEMMA3_MODEL_TYPES:
        if kwargs["context_parallel_size"] > 1:
            raise ValueError("gemma3_text under context parallelism is not supported (SDPA's context-parallel "
                             "attention has no sliding window); set megatron.context_parallel_size=1")
        kwargs.update(gemma3_transformer_kwargs(hf_config))
    if model_type in QWEN_HYBRID_MODEL_TYPES:
        if kwargs["context_parallel_size"] > 1:
            raise ValueError(f"{model_type} under context parallelism is not supported by megarl; set "
                             "megatron.context_parallel_size=1")
        kwargs.update(qwen_hybrid_transformer_kwargs(hf_config))
    if model_type in NEMOTRON_H_MODEL_TYPES:
        if kwargs["context_parallel_size"] > 1:
            raise ValueError("nemotron_h under context parallelism is not supported by megarl; set "
                             "megatron.context_parallel_size=1")
        kwargs.update(nemotron_h_transformer_kwargs(hf_config))
    if model_type in GPT_OSS_MODEL_TYPES:
        if kwargs["context_parallel_size"] > 1:
            raise ValueError("gpt_oss under context parallelism is not supported (SDPA's context-parallel "
                             "attention has no attention sinks); set megatron.context_parallel_size=1")
        if kwargs["expert_tensor_parallel_size"] > 1:
            raise ValueError("gpt_oss's experts have biases, which Megatron-Core supports at expert tensor parallel "
                             "size 1 only; set megatron.expert_tensor_parallel_size=1")
        kwargs.update(gpt_oss_transformer_kwargs(
            hf_config, on_cpu=on_cpu, grouped_gemm=bool(overrides.get("moe_grouped_gemm", kwargs["moe_grouped_gemm"]))))
    kwargs.update(overrides)
    if model_type in MLA_MODEL_TYPES:
        return MLATransformerConfig(**kwargs)
    return (YarnTransformerConfig if model_type in GPT_OSS_MODEL_TYPES else TransformerConfig)(**kwargs)


def _qk_norm(hf_config) -> bool:
    return hf_config.model_type in ("qwen3", "qwen3_moe", "hy_v3", *GEMMA3_MODEL_TYPES, *QWEN_HYBRID_MODEL_TYPES) or (
        hf_config.model_type == "glm4_moe" and bool(getattr(hf_config, "use_qk_norm", False)))


def _qkv_bias(hf_config) -> bool:
    # qwen2 always; qwen2_moe through `qkv_bias` (default true); llama-likes through `attention_bias`.
    if hf_config.model_type == "qwen2":
        return True
    if hf_config.model_type == "qwen2_moe":
        return bool(getattr(hf_config, "qkv_bias", True))
    return bool(getattr(hf_config, "attention_bias", False))
