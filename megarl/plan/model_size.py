"""Parameter counts of a decoder-only HF model from its config.json alone (no weights loaded).

Covers the families megarl builds (Llama, Mistral, Qwen2, Qwen3, Mixtral, Qwen2-MoE, Qwen3-MoE):
embeddings, attention (GQA, optional q/k/v biases, Qwen3's q/k norms), dense SwiGLU MLPs,
MoE layers (router, routed experts, Qwen2-MoE's shared expert and its gate), RMS norms and
a tied or untied LM head.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ModelShape", "ParamCount", "count_params", "load_shape"]


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder that decide its parameters, activations and KV cache."""

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
    experts: int = 0  # routed experts per MoE layer (0: dense model)
    expert_ffn: int = 0
    experts_per_token: int = 0
    shared_expert_ffn: int = 0
    moe_layers: int = 0  # how many of `layers` are MoE layers

    @classmethod
    def from_hf_config(cls, c: dict[str, Any]) -> ModelShape:
        """From a config.json dict (a VLM's `text_config` is used when present)."""
        c = c.get("text_config") or c
        model_type = c.get("model_type", "")
        hidden, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
        experts = c.get("num_experts") or c.get("num_local_experts") or 0
        expert_ffn = c.get("moe_intermediate_size") or (c["intermediate_size"] if experts else 0)
        moe_layers = 0
        if experts:
            step = c.get("decoder_sparse_step") or 1
            dense_only = set(c.get("mlp_only_layers") or [])
            moe_layers = sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
        return cls(
            model_type=model_type, vocab=c["vocab_size"], hidden=hidden, ffn=c["intermediate_size"], layers=layers,
            heads=heads, kv_heads=c.get("num_key_value_heads") or heads,
            head_dim=c.get("head_dim") or hidden // heads,
            tied_embeddings=bool(c.get("tie_word_embeddings", False)),
            # Qwen2 (and Qwen2-MoE) always have q/k/v biases and none on o_proj; the others
            # follow attention_bias on all four projections.
            qkv_bias=model_type in ("qwen2", "qwen2_moe") or bool(c.get("attention_bias", False)),
            out_bias=model_type not in ("qwen2", "qwen2_moe") and bool(c.get("attention_bias", False)),
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            experts=experts, expert_ffn=expert_ffn if experts else 0,
            experts_per_token=c.get("num_experts_per_tok") or 0,
            shared_expert_ffn=c.get("shared_expert_intermediate_size") or 0,
            moe_layers=moe_layers,
        )


@dataclass(frozen=True)
class ParamCount:
    """Parameter counts (elements). ``dense_layer``: one decoder layer's attention + norms
    (+ its dense MLP for dense layers); ``expert``: one routed expert."""

    embedding: int
    lm_head: int  # 0 when tied to the embedding
    attention_and_norms: int  # per layer
    dense_mlp: int  # per dense layer
    moe_shared: int  # per MoE layer: router + shared expert (+ its gate), replicated over EP
    expert: int  # one routed expert
    final_norm: int
    shape: ModelShape

    @property
    def dense_layers(self) -> int:
        return self.shape.layers - self.shape.moe_layers

    @property
    def expert_params(self) -> int:
        """All routed-expert parameters (sharded over expert parallelism)."""
        return self.shape.moe_layers * self.shape.experts * self.expert

    @property
    def total(self) -> int:
        s = self.shape
        return (self.embedding + self.lm_head + self.final_norm + s.layers * self.attention_and_norms
                + self.dense_layers * self.dense_mlp + s.moe_layers * self.moe_shared + self.expert_params)

    @property
    def non_expert(self) -> int:
        return self.total - self.expert_params


def count_params(s: ModelShape) -> ParamCount:
    """Element counts of every parameter group of ``s`` (bias-free MLPs, RMS norms)."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    attention = s.hidden * (q + 2 * kv) + q * s.hidden + (q + 2 * kv if s.qkv_bias else 0) + (s.hidden if s.out_bias else 0)
    norms = 2 * s.hidden + (2 * s.head_dim if s.qk_norm else 0)
    moe_shared = 0
    if s.experts:
        moe_shared = s.hidden * s.experts  # router
        if s.shared_expert_ffn:
            moe_shared += 3 * s.hidden * s.shared_expert_ffn + s.hidden  # shared expert + its sigmoid gate
    return ParamCount(
        embedding=s.vocab * s.hidden, lm_head=0 if s.tied_embeddings else s.vocab * s.hidden,
        attention_and_norms=attention + norms, dense_mlp=3 * s.hidden * s.ffn, moe_shared=moe_shared,
        expert=3 * s.hidden * s.expert_ffn, final_norm=s.hidden, shape=s,
    )


def load_shape(model_dir: str | Path) -> ModelShape:
    """The shape in ``model_dir/config.json``; ValueError naming the file when it is missing."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ValueError(f"{path} not found: the plan reads the model's config.json")
    return ModelShape.from_hf_config(json.loads(path.read_text()))
