"""Parameter counts of a decoder-only HF model from its config.json alone (no weights loaded).

Covers the families megarl builds: Llama, Mistral, Qwen2, Qwen3, Qwen3.5 text (dense); Mixtral, Qwen2-MoE,
Qwen3-MoE, GLM-4.5 (``glm4_moe``), DeepSeek-V3 / Moonlight (``deepseek_v3``), Hy3 (``hy_v3``), GPT-OSS, Qwen3-Next
and Qwen3.5-MoE (MoE), and DeepSeek-V2 (``deepseek_v2``, counted only). What is counted:

* embeddings and a tied or untied LM head; RMS norms (two per layer, the final one);
* attention: GQA (q/k/v biases: Qwen2 always, Qwen2-MoE per ``qkv_bias``, GLM-4.5 per
  ``attention_bias`` on q/k/v only, the others on all four projections; Qwen3's and GLM-4.5's
  ``use_qk_norm`` q/k norms, Hy3's always) or DeepSeek's multi-latent attention (``q_lora_rank`` (null: one
  ``q_proj``), ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``,
  the q/kv latent norms, ``attention_bias`` on q_a / kv_a / o);
* Qwen3.5's (dense, MoE) and Qwen3-Next's hybrid layers: gated attention (q_proj holds a gate per head) on their
  ``full_attention`` layers, gated DeltaNet on their ``linear_attention`` layers (input projections of q, k, v, z and the beta / alpha gates,
  the q/k/v convolution, ``A_log``, ``dt_bias``, the gated norm, the output projection; which layers: ``layer_types``
  or ``full_attention_interval``);
* dense SwiGLU MLPs (``intermediate_size``) and MoE layers: the router, routed experts from
  whichever field the family spells (``num_experts``, ``num_local_experts``,
  ``n_routed_experts``) of ``moe_intermediate_size``, shared experts (Qwen2-MoE:
  ``shared_expert_intermediate_size`` + its sigmoid gate; DeepSeek / GLM:
  ``n_shared_experts x moe_intermediate_size``, Hy3: ``num_shared_experts x moe_intermediate_size``) and the
  router's score-correction bias (``e_score_correction_bias`` of DeepSeek-V3 / GLM-4.5 / Hy3, a buffer in HF and megatron, held
  in memory all the same); GPT-OSS's router bias and expert biases (``2 x I + hidden`` per expert) and its
  attention sinks (one per head and layer);
* which layers are MoE: Qwen's ``mlp_only_layers`` / ``decoder_sparse_step``; DeepSeek's / GLM's
  ``first_k_dense_replace`` (dense first) and ``moe_layer_freq`` (every n-th after that); Hy3's
  ``mlp_layer_types`` (absent: HF's default, the first layer dense);
* Nemotron-H (``nemotron_h``): one block per layer (``layers_block_type`` / ``hybrid_override_pattern``), each
  with one norm: Mamba-2 (in_proj of z, x, B, C, dt; the x/B/C convolution and its bias; ``A_log``, ``D``,
  ``dt_bias``; the gated group norm; out_proj), attention, a non-gated MLP (up, down) or MoE (router with its
  score-correction bias, non-gated experts, one shared expert of ``moe_shared_expert_intermediate_size``).

Not counted: multi-token-prediction layers (``num_nextn_predict_layers``: DeepSeek-V3's 14 B
and GLM-4.5-Air's ~2.5 B). The published totals (671 B, 106 B) leave them out, HF's
models do not build them and megarl neither loads nor trains them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megarl.config.rules.model import hybrid_layer_types, nemotron_h_layer_kinds

__all__ = ["ModelShape", "ParamCount", "count_params", "load_shape"]

_EXPERT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")
_DEEPSEEK_MOE = ("deepseek_v2", "deepseek_v3", "glm4_moe")  # first_k_dense_replace, n_shared_experts
_ROUTER_BIAS = ("deepseek_v3", "glm4_moe", "gpt_oss", "hy_v3")  # e_score_correction_bias; GPT-OSS's router bias
_GPT_OSS = ("gpt_oss",)  # expert biases (gate_up, down), attention sinks, q/k/v/o biases by default


def _moe_layer_count(c: dict[str, Any], model_type: str, layers: int) -> int:
    if model_type == "hy_v3":  # HF's mlp_layer_types; absent, its default (the first layer dense)
        types = c.get("mlp_layer_types")
        return types.count("sparse") if types else max(layers - 1, 0)
    if model_type in _DEEPSEEK_MOE:
        first, freq = c.get("first_k_dense_replace") or 0, c.get("moe_layer_freq") or 1
        return sum(1 for i in range(first, layers) if i % freq == 0)
    step = c.get("decoder_sparse_step") or 1
    dense_only = set(c.get("mlp_only_layers") or [])
    return sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder that decide its parameters, activations and KV cache.

    ``head_dim``: the q/k width of one head (MLA: ``qk_nope_head_dim + qk_rope_head_dim``);
    ``v_head_dim``: the v / attention-output width of one head. ``kv_lora_rank > 0`` marks
    multi-latent attention (then ``kv_heads == heads``).
    """

    model_type: str
    vocab: int
    hidden: int
    ffn: int  # dense MLP intermediate size
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied_embeddings: bool
    qkv_bias: bool
    out_bias: bool
    qk_norm: bool
    v_head_dim: int = 0  # 0: head_dim
    q_lora_rank: int = 0  # MLA: 0 = a single q_proj
    kv_lora_rank: int = 0  # MLA latent width (0: not MLA)
    qk_rope_head_dim: int = 0  # MLA: the rotary part of head_dim, shared by all heads in the latent
    experts: int = 0  # routed experts per MoE layer (0: dense model)
    expert_ffn: int = 0
    experts_per_token: int = 0
    shared_expert_ffn: int = 0  # all shared experts of a layer together
    shared_expert_gate: bool = False  # Qwen2-MoE's sigmoid gate on the shared expert
    router_bias: bool = False  # DeepSeek-V3 / GLM-4.5 e_score_correction_bias, GPT-OSS's router bias
    expert_bias: bool = False  # GPT-OSS: biases on each expert's projections
    attention_sinks: bool = False  # GPT-OSS: one sink logit per head
    attention_gate: bool = False  # Qwen3.5: q_proj holds a gate per head
    linear_layers: int = 0  # Qwen3.5: gated DeltaNet layers among `layers` (no KV cache)
    linear_key_dim: int = 0  # their key heads x key head dim
    linear_value_dim: int = 0  # value heads x value head dim
    linear_value_heads: int = 0
    linear_value_head_dim: int = 0
    linear_conv: int = 0  # convolution width
    moe_layers: int = 0  # how many of `layers` are MoE layers
    # Nemotron-H: its layers are one of Mamba-2, attention, MLP, MoE, each with one norm
    mamba_layers: int = 0  # Mamba-2 layers among `layers` (no KV cache: a state per sequence)
    mamba_inner: int = 0  # mamba_num_heads x mamba_head_dim
    mamba_bc: int = 0  # n_groups x ssm_state_size (each of B, C)
    mamba_heads: int = 0
    mamba_state: int = 0  # ssm_state_size
    mamba_conv: int = 0  # convolution width
    mamba_ssm_cache_dtype: str = "float32"  # what vLLM keeps the SSM state in (config.json's, Nemotron-H's default)
    attention_free_layers: int = 0  # layers with only an MLP / MoE
    mlp_free_layers: int = 0  # layers with only attention / Mamba
    norms_per_layer: int = 2
    gated_mlp: bool = True  # SwiGLU (gate, up, down); Nemotron-H's squared ReLU: up, down

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def v_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    @classmethod
    def from_hf_config(cls, c: dict[str, Any]) -> ModelShape:
        """From a config.json dict (a VLM's `text_config` is used when present)."""
        c = c.get("text_config") or c
        model_type = c.get("model_type", "")
        blocks = nemotron_h_layer_kinds(c) if model_type == "nemotron_h" else None
        # transformers 5 saves Nemotron-H's config.json without num_hidden_layers (the length of its pattern)
        hidden, heads, layers = c["hidden_size"], c["num_attention_heads"], len(blocks) if blocks else c["num_hidden_layers"]
        experts = next((c[f] for f in _EXPERT_FIELDS if c.get(f)), 0)
        moe = dict(experts=experts, experts_per_token=c.get("num_experts_per_tok") or 0,
                   expert_ffn=c.get("moe_intermediate_size") or c["intermediate_size"],
                   moe_layers=_moe_layer_count(c, model_type, layers)) if experts else {}
        if experts and model_type in _DEEPSEEK_MOE:
            moe["shared_expert_ffn"] = (c.get("n_shared_experts") or 0) * moe["expert_ffn"]
            moe["router_bias"] = model_type in _ROUTER_BIAS
        elif experts and model_type == "hy_v3":
            moe.update(shared_expert_ffn=(c.get("num_shared_experts") or 0) * moe["expert_ffn"], router_bias=True)
        elif experts and model_type in _GPT_OSS:
            moe.update(router_bias=True, expert_bias=True)
        elif experts and c.get("shared_expert_intermediate_size"):
            moe.update(shared_expert_ffn=c["shared_expert_intermediate_size"], shared_expert_gate=True)
        bias = bool(c.get("attention_bias", model_type in _GPT_OSS))  # GPT-OSS: biased unless it says not
        attention: dict[str, Any]
        if c.get("kv_lora_rank"):  # DeepSeek multi-latent attention
            attention = dict(kv_heads=heads, head_dim=c["qk_nope_head_dim"] + c["qk_rope_head_dim"],
                             v_head_dim=c["v_head_dim"], q_lora_rank=c.get("q_lora_rank") or 0,
                             kv_lora_rank=c["kv_lora_rank"], qk_rope_head_dim=c["qk_rope_head_dim"],
                             qkv_bias=bias, out_bias=bias, qk_norm=False)
        else:
            qkv_bias = {"qwen2": True, "qwen2_moe": bool(c.get("qkv_bias", True))}.get(model_type, bias)
            attention = dict(kv_heads=c.get("num_key_value_heads") or heads,
                             head_dim=c.get("head_dim") or hidden // heads, qkv_bias=qkv_bias,
                             out_bias=bias and model_type not in ("qwen2", "qwen2_moe", "glm4_moe"),
                             qk_norm=model_type in ("qwen3", "qwen3_moe", "hy_v3") or (
                                 model_type == "glm4_moe" and bool(c.get("use_qk_norm", False))),
                             attention_sinks=model_type in _GPT_OSS)
        kinds = hybrid_layer_types(c) or []
        if "linear_attention" in kinds:  # Qwen3.5's / Qwen3-Next's gated DeltaNet layers
            attention.update(
                attention_gate=True, qk_norm=True, linear_layers=kinds.count("linear_attention"),
                linear_key_dim=c["linear_num_key_heads"] * c["linear_key_head_dim"],
                linear_value_dim=c["linear_num_value_heads"] * c["linear_value_head_dim"],
                linear_value_heads=c["linear_num_value_heads"], linear_value_head_dim=c["linear_value_head_dim"],
                linear_conv=c.get("linear_conv_kernel_dim") or 4)
        if blocks and experts:
            moe.update(shared_expert_ffn=c.get("moe_shared_expert_intermediate_size") or 0, router_bias=True,
                       moe_layers=blocks.count("moe"))
        if blocks:
            attention.update(
                mamba_layers=blocks.count("linear_attention"),
                mamba_inner=c.get("mamba_num_heads", 128) * c.get("mamba_head_dim", 64),  # NemotronHConfig's defaults
                mamba_bc=c.get("n_groups", 8) * c.get("ssm_state_size", 128), mamba_heads=c.get("mamba_num_heads", 128),
                mamba_state=c.get("ssm_state_size", 128), mamba_conv=c.get("conv_kernel", 4),
                mamba_ssm_cache_dtype=c.get("mamba_ssm_cache_dtype", "float32"),
                attention_free_layers=blocks.count("mlp") + blocks.count("moe"),
                mlp_free_layers=blocks.count("linear_attention") + blocks.count("full_attention"),
                norms_per_layer=1, gated_mlp=False)
        return cls(model_type=model_type, vocab=c["vocab_size"], hidden=hidden, ffn=c["intermediate_size"],
                   layers=layers, heads=heads, tied_embeddings=bool(c.get("tie_word_embeddings", False)),
                   **attention, **moe)


@dataclass(frozen=True)
class ParamCount:
    """Parameter counts (elements). ``attention_and_norms``: one decoder layer's attention +
    norms; ``dense_mlp``: one dense layer's MLP; ``expert``: one routed expert."""

    embedding: int
    lm_head: int  # 0 when tied to the embedding
    attention_and_norms: int  # per (softmax) attention layer
    linear_attention_and_norms: int  # per gated DeltaNet layer (Qwen3.5)
    mamba_and_norms: int  # per Mamba-2 layer (Nemotron-H)
    dense_mlp: int  # per dense layer
    moe_shared: int  # per MoE layer: router (+ its bias) + shared experts (+ gate), replicated over EP
    expert: int  # one routed expert
    final_norm: int
    shape: ModelShape

    @property
    def dense_layers(self) -> int:
        return self.shape.layers - self.shape.moe_layers - self.shape.mlp_free_layers

    @property
    def softmax_layers(self) -> int:
        """Layers with softmax attention."""
        s = self.shape
        return s.layers - s.linear_layers - s.mamba_layers - s.attention_free_layers

    @property
    def attention_params(self) -> int:
        """Every layer's attention (softmax, gated DeltaNet or Mamba-2) and norms."""
        s = self.shape
        return (self.softmax_layers * self.attention_and_norms + s.linear_layers * self.linear_attention_and_norms
                + s.mamba_layers * self.mamba_and_norms)

    @property
    def expert_params(self) -> int:
        """All routed-expert parameters (sharded over expert parallelism)."""
        return self.shape.moe_layers * self.shape.experts * self.expert

    @property
    def total(self) -> int:
        s = self.shape
        return (self.embedding + self.lm_head + self.final_norm + self.attention_params
                + self.dense_layers * self.dense_mlp + s.moe_layers * self.moe_shared + self.expert_params)

    @property
    def active(self) -> int:
        """Parameters one token passes through: all but the routed experts it is not sent to
        (embedding and LM head included, as Qwen and DeepSeek count; GLM counts without them)."""
        s = self.shape
        return self.total - s.moe_layers * (s.experts - s.experts_per_token) * self.expert

    @property
    def non_expert(self) -> int:
        return self.total - self.expert_params


def _attention(s: ModelShape) -> int:
    h = s.hidden
    if s.mla:
        q_out = s.heads * s.head_dim
        q = h * q_out if not s.q_lora_rank else h * s.q_lora_rank + s.q_lora_rank + s.q_lora_rank * q_out
        kv_a = h * (s.kv_lora_rank + s.qk_rope_head_dim) + s.kv_lora_rank  # + the latent's norm
        kv_b = s.kv_lora_rank * s.heads * (s.head_dim - s.qk_rope_head_dim + s.v_head_dim)
        bias = ((s.q_lora_rank or 0) + s.kv_lora_rank + s.qk_rope_head_dim + h) if s.qkv_bias else 0
        return q + kv_a + kv_b + s.heads * s.v_head_dim * h + bias
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    return (h * (q + 2 * kv) + q * h + (q + 2 * kv if s.qkv_bias else 0) + (h if s.out_bias else 0)
            + (h * q if s.attention_gate else 0)
            + (2 * s.head_dim if s.qk_norm else 0) + (s.heads if s.attention_sinks else 0))


def _linear_attention(s: ModelShape) -> int:
    """One gated DeltaNet: in_proj_qkv / z / b / a, the q/k/v convolution, A_log, dt_bias, the gated norm, out_proj."""
    if not s.linear_layers:
        return 0
    qkv = 2 * s.linear_key_dim + s.linear_value_dim
    return (s.hidden * (qkv + s.linear_value_dim + 2 * s.linear_value_heads) + qkv * s.linear_conv
            + 2 * s.linear_value_heads + s.linear_value_head_dim + s.linear_value_dim * s.hidden)


def _mamba(s: ModelShape) -> int:
    """One Mamba-2 mixer: in_proj (z, x, B, C, dt), the x/B/C convolution and its bias, A_log / D / dt_bias, the
    gated norm, out_proj."""
    conv = s.mamba_inner + 2 * s.mamba_bc
    return (s.hidden * (2 * s.mamba_inner + 2 * s.mamba_bc + s.mamba_heads) + conv * (s.mamba_conv + 1)
            + 3 * s.mamba_heads + s.mamba_inner + s.mamba_inner * s.hidden)


def count_params(s: ModelShape) -> ParamCount:
    """Element counts of every parameter group of ``s`` (bias-free MLPs, RMS norms)."""
    mlp = 3 if s.gated_mlp else 2  # weight matrices of an MLP / expert
    mlp_norm = s.hidden if s.attention_free_layers else 0  # Nemotron-H: an MLP / MoE layer's own norm
    moe_shared = 0
    if s.experts:
        moe_shared = s.hidden * s.experts + (s.experts if s.router_bias else 0)  # router
        moe_shared += mlp * s.hidden * s.shared_expert_ffn + (s.hidden if s.shared_expert_gate else 0) + mlp_norm
    norms = s.norms_per_layer * s.hidden
    return ParamCount(
        embedding=s.vocab * s.hidden, lm_head=0 if s.tied_embeddings else s.vocab * s.hidden,
        attention_and_norms=_attention(s) + norms, dense_mlp=mlp * s.hidden * s.ffn + mlp_norm, moe_shared=moe_shared,
        linear_attention_and_norms=_linear_attention(s) + norms if s.linear_layers else 0,
        mamba_and_norms=_mamba(s) + norms if s.mamba_layers else 0,
        expert=mlp * s.hidden * s.expert_ffn + (2 * s.expert_ffn + s.hidden if s.expert_bias else 0),
        final_norm=s.hidden, shape=s,
    )


def load_shape(model_dir: str | Path) -> ModelShape:
    """The shape in ``model_dir/config.json``; ValueError naming the file when it is missing."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ValueError(f"{path} not found: the plan reads the model's config.json")
    return ModelShape.from_hf_config(json.loads(path.read_text()))
