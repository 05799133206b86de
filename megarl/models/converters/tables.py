"""Per-architecture name/layout tables: megatron parameter <-> HF parameter(s).

One :class:`Rule` per megatron parameter. Templates use ``{layer}`` (global layer index
in HF names, local index inside a GPTModel chunk in megatron names) and ``{expert}``
(global expert index in HF names, local index on the EP rank in megatron names).
Megatron names are those of the local layer spec (``megarl.models.spec``);
:data:`TE_ALIASES` gives the transformer-engine spelling of the same parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Rule", "ArchTables", "arch_tables", "TE_ALIASES"]


@dataclass(frozen=True)
class Rule:
    """One megatron parameter and the HF parameter(s) it is made of.

    Attributes:
        mcore: megatron name template (relative to a GPTModel chunk).
        hf: HF name templates; several when megatron fuses them (q/k/v, gate/up).
        kind: layout kind, see ``megarl.models.converters.transforms``.
    """

    mcore: str
    hf: tuple[str, ...]
    kind: str


@dataclass(frozen=True)
class ArchTables:
    """Rules of one model, by where the parameter lives.

    ``first``: only on the first pipeline chunk; ``layer``: per decoder layer;
    ``dense_mlp``: per dense-MLP layer; ``moe``: per MoE layer (router, shared expert);
    ``expert``: per expert of a MoE layer (split over EP, and ETP instead of TP);
    ``last``: only on the last pipeline chunk. ``moe_pattern[i]`` is 1 where decoder
    layer ``i`` is MoE, 0 where dense (empty: a dense model).
    """

    first: tuple[Rule, ...]
    layer: tuple[Rule, ...]
    dense_mlp: tuple[Rule, ...]
    moe: tuple[Rule, ...]
    expert: tuple[Rule, ...]
    last: tuple[Rule, ...]
    moe_pattern: tuple[int, ...] = ()
    # The ``expert`` rules' HF tensors hold every expert of the layer, stacked along dim 0 (GPT-OSS), instead of
    # one HF tensor per expert; their HF templates have no ``{expert}``.
    stacked_experts: bool = False
    # Hybrids (Qwen3.5): layer ``i`` takes ``linear_layer`` instead of ``layer`` where ``linear_pattern[i]`` is 1
    linear_layer: tuple[Rule, ...] = ()
    linear_pattern: tuple[int, ...] = ()
    # Nemotron-H: layer ``i``'s rules are ``per_layer[i]`` (its kind's: Mamba, attention, MLP or MoE) instead of
    # ``layer`` / ``linear_layer`` and ``dense_mlp`` / ``moe``; its experts still by ``moe_pattern``
    per_layer: tuple[tuple[Rule, ...], ...] = ()
    # Tied embeddings: the last chunk's copy of the embedding, when it is not also the
    # first chunk (PP > 1). Loaded from the embedding; never exported (same tensor).
    tied_output: Rule | None = None


_L = "model.layers.{layer}."
_M = "decoder.layers.{layer}."

_ATTENTION = (
    Rule(_M + "input_layernorm.weight", (_L + "input_layernorm.weight",), "replicated"),
    Rule(
        _M + "self_attention.linear_qkv.weight",
        tuple(_L + f"self_attn.{p}_proj.weight" for p in "qkv"),
        "qkv",
    ),
    Rule(_M + "self_attention.linear_proj.weight", (_L + "self_attn.o_proj.weight",), "split1"),
    Rule(_M + "pre_mlp_layernorm.weight", (_L + "post_attention_layernorm.weight",), "replicated"),
)
_A = _M + "self_attention."
# Gemma 3: sandwich norms (post-attention on the attention's output, pre-/post-feedforward around the MLP)
_GEMMA3_NORMS = (
    _ATTENTION[0], _ATTENTION[1], _ATTENTION[2],
    Rule(_A + "post_attention_layernorm.weight", (_L + "post_attention_layernorm.weight",), "replicated"),
    Rule(_M + "pre_mlp_layernorm.weight", (_L + "pre_feedforward_layernorm.weight",), "replicated"),
    Rule(_M + "mlp.post_feedforward_layernorm.weight", (_L + "post_feedforward_layernorm.weight",), "replicated"),
)
_H = _L + "self_attn."
# DeepSeek-V3 multi-latent attention (megatron's local MLA spec: the down projections are
# column-parallel too). Without q_lora_rank, q_proj replaces the q_a / q_b pair.
_MLA_Q_LORA = (
    Rule(_A + "linear_q_down_proj.weight", (_H + "q_a_proj.weight",), "split0"),
    Rule(_A + "q_layernorm.weight", (_H + "q_a_layernorm.weight",), "replicated"),
    Rule(_A + "linear_q_up_proj.weight", (_H + "q_b_proj.weight",), "split0"),
)
_MLA_Q = (Rule(_A + "linear_q_proj.weight", (_H + "q_proj.weight",), "split0"),)
_MLA_KV = (
    Rule(_A + "linear_kv_down_proj.weight", (_H + "kv_a_proj_with_mqa.weight",), "split0"),
    Rule(_A + "kv_layernorm.weight", (_H + "kv_a_layernorm.weight",), "replicated"),
    Rule(_A + "linear_kv_up_proj.weight", (_H + "kv_b_proj.weight",), "split0"),
)


def _mla_attention(hf_config) -> tuple[Rule, ...]:
    norms_and_proj = (_ATTENTION[0], _ATTENTION[2], _ATTENTION[3])  # input norm, o_proj, pre-MLP norm
    q = _MLA_Q_LORA if hf_config.q_lora_rank else _MLA_Q
    return norms_and_proj[:1] + q + _MLA_KV + norms_and_proj[1:]


_QKV_BIAS = (
    Rule(
        _M + "self_attention.linear_qkv.bias",
        tuple(_L + f"self_attn.{p}_proj.bias" for p in "qkv"),
        "qkv",
    ),
)
_QK_NORM = (
    Rule(_M + "self_attention.q_layernorm.weight", (_L + "self_attn.q_norm.weight",), "replicated"),
    Rule(_M + "self_attention.k_layernorm.weight", (_L + "self_attn.k_norm.weight",), "replicated"),
)
_DENSE_MLP = (
    Rule(_M + "mlp.linear_fc1.weight", (_L + "mlp.gate_proj.weight", _L + "mlp.up_proj.weight"), "gate_up"),
    Rule(_M + "mlp.linear_fc2.weight", (_L + "mlp.down_proj.weight",), "split1"),
)
_X = _M + "mlp.experts.local_experts.{expert}."


def _experts(prefix: str, gate: str, up: str, down: str) -> tuple[Rule, ...]:
    """Per-expert rules; HF expert ``{expert}`` is under ``prefix`` with these projection names."""
    return (
        Rule(_X + "linear_fc1.weight", (prefix + gate + ".weight", prefix + up + ".weight"), "gate_up"),
        Rule(_X + "linear_fc2.weight", (prefix + down + ".weight",), "split1"),
    )


_QWEN_ROUTER = (Rule(_M + "mlp.router.weight", (_L + "mlp.gate.weight",), "replicated"),)
_QWEN_EXPERTS = _experts(_L + "mlp.experts.{expert}.", "gate_proj", "up_proj", "down_proj")
_MIXTRAL_ROUTER = (Rule(_M + "mlp.router.weight", (_L + "block_sparse_moe.gate.weight",), "replicated"),)
_MIXTRAL_EXPERTS = _experts(_L + "block_sparse_moe.experts.{expert}.", "w1", "w3", "w2")
_S = _L + "mlp.shared_expert."
_SHARED_EXPERT = (
    Rule(_M + "mlp.shared_experts.linear_fc1.weight", (_S + "gate_proj.weight", _S + "up_proj.weight"), "gate_up"),
    Rule(_M + "mlp.shared_experts.linear_fc2.weight", (_S + "down_proj.weight",), "split1"),
    Rule(_M + "mlp.shared_experts.gate_weight", (_L + "mlp.shared_expert_gate.weight",), "replicated"),
)


def _sigmoid_moe(router: str, bias: str, shared: str) -> tuple[Rule, ...]:
    """Router, score-correction bias and shared experts (HF names under ``model.layers.{layer}.``); megatron's
    expert bias is a float32 buffer (see megarl.models.weights.converted_tensors)."""
    return (
        Rule(_M + "mlp.router.weight", (_L + router,), "replicated"),
        Rule(_M + "mlp.router.expert_bias", (_L + bias,), "replicated"),
        Rule(_M + "mlp.shared_experts.linear_fc1.weight", (_L + shared + "gate_proj.weight", _L + shared + "up_proj.weight"),
             "gate_up"),
        Rule(_M + "mlp.shared_experts.linear_fc2.weight", (_L + shared + "down_proj.weight",), "split1"),
    )


_GLM_MOE = _sigmoid_moe("mlp.gate.weight", "mlp.gate.e_score_correction_bias", "mlp.shared_experts.")
# Hy3's checkpoint names (transformers renames them on load: conversion_mapping.py's "hy_v3")
_HY_V3_MOE = _sigmoid_moe("mlp.router.gate.weight", "mlp.expert_bias", "mlp.shared_mlp.")
# Qwen3.5's and Qwen3-Next's layers: attention with an output gate (q_proj holds each head's query and gate), or a gated DeltaNet
_GATED_QKV = Rule(_A + "linear_qkv.weight", tuple(_H + f"{p}_proj.weight" for p in "qkv"), "qkv_gated")
_G = _L + "linear_attn."
_GDN_IN_PROJ = {  # model_type -> the DeltaNet's input projection
    "qwen3_5_text": Rule(_A + "in_proj.weight", tuple(_G + f"in_proj_{p}.weight" for p in ("qkv", "z", "b", "a")),
                         "gdn_in_proj"),
    "qwen3_next": Rule(_A + "in_proj.weight", (_G + "in_proj_qkvz.weight", _G + "in_proj_ba.weight"), "gdn_in_proj_grouped"),
}
_GDN_IN_PROJ["qwen3_5_moe_text"] = _GDN_IN_PROJ["qwen3_5_text"]
_GATED_DELTANET = (
    Rule(_A + "conv1d.weight", (_G + "conv1d.weight",), "gdn_conv"),
    Rule(_A + "A_log", (_G + "A_log",), "split0"),
    Rule(_A + "dt_bias", (_G + "dt_bias",), "split0"),
    Rule(_A + "out_norm.weight", (_G + "norm.weight",), "replicated"),
    Rule(_A + "out_proj.weight", (_G + "out_proj.weight",), "split1"),
)
# GPT-OSS: biases on q/k/v/o, attention sinks (one logit per head, split over TP with the heads), a
# biased router, and each layer's experts stacked in one HF tensor per parameter (ArchTables.stacked_experts)
_GPT_OSS_ATTENTION = (
    Rule(_A + "linear_proj.bias", (_H + "o_proj.bias",), "replicated"),
    Rule(_A + "core_attention.softmax_offset", (_H + "sinks",), "split0"),
)
_GPT_OSS_ROUTER = (
    Rule(_M + "mlp.router.weight", (_L + "mlp.router.weight",), "replicated"),
    Rule(_M + "mlp.router.bias", (_L + "mlp.router.bias",), "replicated"),
)
_SE = _L + "mlp.experts."
_GPT_OSS_EXPERTS = (
    Rule(_X + "linear_fc1.weight", (_SE + "gate_up_proj",), "gate_up_interleaved"),
    Rule(_X + "linear_fc1.bias", (_SE + "gate_up_proj_bias",), "gate_up_interleaved"),
    Rule(_X + "linear_fc2.weight", (_SE + "down_proj",), "split1_transposed"),
    Rule(_X + "linear_fc2.bias", (_SE + "down_proj_bias",), "replicated"),
)
# Nemotron-H (checkpoint names under ``backbone.``; transformers renames them on load: conversion_mapping.py's
# "nemotron_h"): every layer is ``norm`` + ``mixer``, the mixer a Mamba-2 mixer (megatron's MambaMixer in the
# attention's place, megarl.models.nemotron_h), attention without rotary, a non-gated MLP or a MoE.
_NB = "backbone.layers.{layer}."
_NX = _NB + "mixer."
_NEMOTRON_H_NORM = {"attention": Rule(_M + "input_layernorm.weight", (_NB + "norm.weight",), "replicated"),
                    "mlp": Rule(_M + "pre_mlp_layernorm.weight", (_NB + "norm.weight",), "replicated")}
_NEMOTRON_H_LAYERS = {
    "linear_attention": (
        _NEMOTRON_H_NORM["attention"],
        Rule(_A + "in_proj.weight", (_NX + "in_proj.weight",), "mamba_in_proj"),
        Rule(_A + "conv1d_weight", (_NX + "conv1d.weight",), "mamba_conv"),
        Rule(_A + "conv1d_bias", (_NX + "conv1d.bias",), "mamba_conv"),
        *(Rule(_A + name, (_NX + name,), "split0") for name in ("A_log", "D", "dt_bias", "norm.weight")),
        Rule(_A + "out_proj.weight", (_NX + "out_proj.weight",), "split1"),
    ),
    "full_attention": (
        _NEMOTRON_H_NORM["attention"],
        Rule(_A + "linear_qkv.weight", tuple(_NX + f"{p}_proj.weight" for p in "qkv"), "qkv"),
        Rule(_A + "linear_proj.weight", (_NX + "o_proj.weight",), "split1"),
    ),
    "mlp": (
        _NEMOTRON_H_NORM["mlp"],
        Rule(_M + "mlp.linear_fc1.weight", (_NX + "up_proj.weight",), "split0"),
        Rule(_M + "mlp.linear_fc2.weight", (_NX + "down_proj.weight",), "split1"),
    ),
    "moe": (
        _NEMOTRON_H_NORM["mlp"],
        Rule(_M + "mlp.router.weight", (_NX + "gate.weight",), "replicated"),
        Rule(_M + "mlp.router.expert_bias", (_NX + "gate.e_score_correction_bias",), "replicated"),
        Rule(_M + "mlp.shared_experts.linear_fc1.weight", (_NX + "shared_experts.up_proj.weight",), "split0"),
        Rule(_M + "mlp.shared_experts.linear_fc2.weight", (_NX + "shared_experts.down_proj.weight",), "split1"),
    ),
}
_NEMOTRON_H_EXPERTS = (
    Rule(_X + "linear_fc1.weight", (_NX + "experts.{expert}.up_proj.weight",), "split0"),
    Rule(_X + "linear_fc2.weight", (_NX + "experts.{expert}.down_proj.weight",), "split1"),
)
# model_type -> (per-MoE-layer rules, per-expert rules)
_MOE = {
    "gpt_oss": (_GPT_OSS_ROUTER, _GPT_OSS_EXPERTS),
    "glm4_moe": (_GLM_MOE, _QWEN_EXPERTS),
    "deepseek_v3": (_GLM_MOE, _QWEN_EXPERTS),
    "hy_v3": (_HY_V3_MOE, _QWEN_EXPERTS),
    "qwen3_moe": (_QWEN_ROUTER, _QWEN_EXPERTS),
    "qwen2_moe": (_QWEN_ROUTER + _SHARED_EXPERT, _QWEN_EXPERTS),
    "qwen3_next": (_QWEN_ROUTER + _SHARED_EXPERT, _QWEN_EXPERTS),
    "qwen3_5_moe_text": (_QWEN_ROUTER + _SHARED_EXPERT, _QWEN_EXPERTS),
    "mixtral": (_MIXTRAL_ROUTER, _MIXTRAL_EXPERTS),
    "nemotron_h": ((), _NEMOTRON_H_EXPERTS),  # its routers: _NEMOTRON_H_LAYERS["moe"]
}
_EMBEDDING = (Rule("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "vocab"),)
_FINAL_NORM = Rule("decoder.final_layernorm.weight", ("model.norm.weight",), "replicated")
_LM_HEAD = Rule("output_layer.weight", ("lm_head.weight",), "vocab")
# A critic's value head: HF AutoModelForTokenClassification(num_labels=1) naming.
_VALUE_HEAD = Rule("output_layer.weight", ("score.weight",), "replicated")

# Transformer-engine spec spellings of the same parameters (layernorm fused into the
# following linear; grouped experts): local name suffix -> TE name suffix.
TE_ALIASES = {
    "input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
    "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight",
    "mlp.experts.local_experts.{expert}.linear_fc1.weight": "mlp.experts.linear_fc1.weight{expert}",
    "mlp.experts.local_experts.{expert}.linear_fc2.weight": "mlp.experts.linear_fc2.weight{expert}",
    "mlp.experts.local_experts.{expert}.linear_fc1.bias": "mlp.experts.linear_fc1.bias{expert}",
    "mlp.experts.local_experts.{expert}.linear_fc2.bias": "mlp.experts.linear_fc2.bias{expert}",
}


def arch_tables(hf_config, *, value_head: bool = False) -> ArchTables:
    """The rules for ``hf_config`` (``megarl.models.config.SUPPORTED_MODEL_TYPES``).

    Args:
        value_head: critic model: ``output_layer`` is the value head (``score.weight``)
            and never tied to the embedding.
    """
    from megarl.models.config import _qk_norm, _qkv_bias
    from megarl.models.moe_config import moe_layer_pattern

    model_type = hf_config.model_type
    from megarl.models.gemma3 import GEMMA3_MODEL_TYPES
    from megarl.models.qwen_hybrid import QWEN_HYBRID_MODEL_TYPES, layer_types

    if model_type == "deepseek_v3":
        layer = list(_mla_attention(hf_config))
    elif model_type in QWEN_HYBRID_MODEL_TYPES:
        layer = [_ATTENTION[0], _GATED_QKV, *_ATTENTION[2:]]
    else:
        layer = list(_GEMMA3_NORMS if model_type in GEMMA3_MODEL_TYPES else _ATTENTION)
    if _qkv_bias(hf_config):
        layer += _QKV_BIAS
    if _qk_norm(hf_config):
        layer += _QK_NORM
    if model_type == "gpt_oss":
        layer += _GPT_OSS_ATTENTION
    moe, experts = _MOE.get(model_type, ((), ()))
    nemotron_h = model_type == "nemotron_h"
    last = [Rule("decoder.final_layernorm.weight", ("backbone.norm_f.weight",), "replicated") if nemotron_h
            else _FINAL_NORM]
    if value_head:
        last.append(_VALUE_HEAD)
    elif not getattr(hf_config, "tie_word_embeddings", False):
        last.append(_LM_HEAD)
    tied = not value_head and bool(getattr(hf_config, "tie_word_embeddings", False))
    if nemotron_h:
        from megarl.models.nemotron_h import nemotron_h_layer_kinds

        per_layer = tuple(_NEMOTRON_H_LAYERS[kind] for kind in nemotron_h_layer_kinds(hf_config))
    return ArchTables(
        first=(Rule("embedding.word_embeddings.weight", ("backbone.embeddings.weight",), "vocab"),) if nemotron_h
        else _EMBEDDING,
        layer=tuple(layer),
        dense_mlp=_DENSE_MLP,
        moe=moe,
        expert=experts,
        last=tuple(last),
        moe_pattern=tuple(moe_layer_pattern(hf_config)) if model_type in _MOE else (),
        stacked_experts=model_type == "gpt_oss",
        linear_layer=((_ATTENTION[0], _GDN_IN_PROJ[model_type], *_GATED_DELTANET, _ATTENTION[3])
                      if model_type in QWEN_HYBRID_MODEL_TYPES else ()),
        linear_pattern=(tuple(int(t == "linear_attention") for t in layer_types(hf_config))
                        if model_type in QWEN_HYBRID_MODEL_TYPES else ()),
        per_layer=per_layer if nemotron_h else (),
        tied_output=Rule("output_layer.weight", ("model.embed_tokens.weight",), "vocab") if tied else None,
    )
