"""DeepSeek-V3 multi-latent attention (MLA): HF fields -> megatron ``MLATransformerConfig`` fields.

HF ``DeepseekV3Attention`` and megatron's ``MLASelfAttention`` compute the same thing:
q = q_b(norm(q_a(x))) (or q_proj(x) without ``q_lora_rank``), kv latent + shared rotary key from
``kv_a_proj_with_mqa``, k/v = kv_b(norm(latent)), rotary on the last ``qk_rope_head_dim`` dims of
q and k. HF's ``rope_interleave`` (the rotary dims stored interleaved) is what megatron's MLA
rotary does (it de-interleaves before rotating); softmax scale ``1 / sqrt(qk_nope + qk_rope)``.

Rotary: default or YaRN (DeepSeek-V3's ``factor`` 40), see :func:`_yarn_kwargs`. Scope: the local layer spec
(SDPA core attention; megatron's transformer-engine MLA spec keeps the down projections
unsplit over TP where the local spec splits them, which megarl's converters do not tell apart).
"""

from __future__ import annotations

from typing import Any

__all__ = ["MLA_MODEL_TYPES", "check_mla_supported", "mla_transformer_kwargs"]

MLA_MODEL_TYPES = ("deepseek_v3",)


def _rope_parameters(hf_config) -> dict[str, Any]:
    return dict(getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {})


def check_mla_supported(hf_config, transformer_impl: str) -> None:
    """Raise ValueError naming what megarl cannot honour for an MLA model."""
    params = _rope_parameters(hf_config)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "yarn"):
        raise ValueError(f"{hf_config.model_type} rope scaling {rope_type!r} (config.json rope_parameters / "
                         "rope_scaling) is not supported; default or yarn")
    if rope_type == "yarn" and (params.get("attention_factor") is not None or not params.get("truncate", True)
                                or (params.get("mscale", 1) != 1 and not params.get("mscale_all_dim"))):
        raise ValueError(f"{hf_config.model_type} yarn with attention_factor, truncate=false, or mscale without "
                         "mscale_all_dim is not supported (megatron's YaRN derives the factor from mscale / "
                         "mscale_all_dim and rounds the correction range)")
    if not getattr(hf_config, "rope_interleave", True):
        raise ValueError(f"{hf_config.model_type} rope_interleave=false is not supported (megatron's MLA "
                         "rotary de-interleaves)")
    if getattr(hf_config, "attention_bias", False):
        raise ValueError(f"{hf_config.model_type} attention_bias=true is not supported")
    if transformer_impl != "local":
        raise ValueError(
            f"{hf_config.model_type} (multi-latent attention) runs on the local layer spec only: set "
            "megatron.override_transformer_config.transformer_impl=local"
        )


def _yarn_kwargs(hf_config) -> dict[str, Any]:
    """HF YaRN parameters as megatron's: cos/sin scaled by ``mscale(f, mscale) / mscale(f, mscale_all_dim)``
    and the softmax by ``mscale(f, mscale_all_dim)^2`` in both (``mscale(f, m) = 0.1 m ln f + 1``)."""
    params = _rope_parameters(hf_config)
    if params.get("rope_type", params.get("type", "default")) != "yarn":
        return {"rope_type": "rope"}
    factor = params.get("factor") or hf_config.max_position_embeddings / params["original_max_position_embeddings"]
    return dict(
        rope_type="yarn",
        rotary_scaling_factor=float(factor),
        original_max_position_embeddings=int(params["original_max_position_embeddings"]),
        beta_fast=float(params.get("beta_fast") or 32),
        beta_slow=float(params.get("beta_slow") or 1),
        mscale=float(params.get("mscale") or 1.0),
        mscale_all_dim=float(params.get("mscale_all_dim") or 0.0),
    )


def mla_transformer_kwargs(hf_config) -> dict[str, Any]:
    """MLATransformerConfig keyword arguments (attention part) for ``hf_config``."""
    return dict(
        multi_latent_attention=True,
        q_lora_rank=hf_config.q_lora_rank,
        kv_lora_rank=hf_config.kv_lora_rank,
        qk_head_dim=hf_config.qk_nope_head_dim,
        qk_pos_emb_head_dim=hf_config.qk_rope_head_dim,
        v_head_dim=hf_config.v_head_dim,
        kv_channels=hf_config.v_head_dim,
        num_query_groups=hf_config.num_attention_heads,
        qk_layernorm=True,  # q_a_layernorm, kv_a_layernorm
        add_qkv_bias=False,
        **_yarn_kwargs(hf_config),
    )
