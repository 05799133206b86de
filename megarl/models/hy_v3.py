"""Tencent Hy3 (``hy_v3``, ``HYV3ForCausalLM``): what megarl builds of it and what it refuses.

Hy3 is assembled from pieces megarl already maps (transformers 5.19's ``modular_hy_v3.py``): Llama's RMSNorm,
rotary and SwiGLU MLP; GQA attention with per-head q/k RMSNorm before the rotary (``qk_layernorm``, as Qwen3);
DeepSeek-V3's routing without groups (sigmoid scores, top-k of ``scores + expert_bias``, the k weights
renormalised and scaled by ``router_scaling_factor``: megatron's sigmoid router with a frozen expert bias, see
:mod:`megarl.models.moe_config`), ``num_shared_experts`` shared experts of ``moe_intermediate_size`` each, and
dense layers where ``mlp_layer_types`` says ``dense`` (HF's default: the first layer only). No load-balancing
loss: HF computes none for it whatever ``output_router_logits`` says. ``enable_moe_fp32_combine`` (adding the
routed and shared outputs in fp32) changes nothing: a bf16 add already rounds the fp32 sum once.

HF transformers and vLLM 0.32 read different fields of the same config.json: HF always renormalises the top-k
weights, always applies the q/k norms and takes its dense layers from ``mlp_layer_types``; vLLM follows
``route_norm``, ``qk_norm`` and ``first_k_dense_replace`` and sizes its experts by ``expert_hidden_dim``. The
released config.json has both (consistent); one where they disagree would train one model and roll out another,
so it is refused, naming the field.
"""

from __future__ import annotations

__all__ = ["HY_V3_MODEL_TYPES", "check_hy_v3_supported", "hy_v3_moe_layer_pattern"]

HY_V3_MODEL_TYPES = ("hy_v3",)


def hy_v3_moe_layer_pattern(hf_config) -> list[int]:
    """Per decoder layer: 1 = MoE, 0 = dense (``[num_hidden_layers]``), as HF builds them."""
    types = getattr(hf_config, "mlp_layer_types", None)
    if types is None:  # HYV3Config's default (getattr: the preflight reads the raw config.json)
        layers = hf_config.num_hidden_layers
        types = ["dense"] * min(layers, 1) + ["sparse"] * max(layers - 1, 0)
    return [int(t == "sparse") for t in types]


def check_hy_v3_supported(hf_config) -> None:
    """Raise ValueError naming the config.json field megarl (or its vLLM rollout) cannot honour."""
    types = getattr(hf_config, "mlp_layer_types", None)
    if types is not None and (len(types) != hf_config.num_hidden_layers or set(types) - {"dense", "sparse"}):
        raise ValueError(f"hy_v3 mlp_layer_types {types!r} must name 'dense' or 'sparse' for each of the "
                         f"{hf_config.num_hidden_layers} layers")
    for field in ("attention_bias", "mlp_bias"):
        if getattr(hf_config, field, False):
            raise ValueError(f"hy_v3 {field}=true is not supported (megarl maps Hy3's projections without biases); "
                             "set it to false")
    if getattr(hf_config, "num_experts_per_tok", 8) < 2:
        raise ValueError("hy_v3 num_experts_per_tok=1 is not supported (HF renormalises the one weight to 1, "
                         "megatron's sigmoid router keeps its score)")
    if not getattr(hf_config, "num_shared_experts", 1):
        raise ValueError("hy_v3 without shared experts (num_shared_experts=0) is not supported (HF then builds a "
                         "shared MLP of intermediate_size, vLLM none)")
    # vLLM's HYV3ForCausalLM reads these; HF does not
    missing = [f for f in ("first_k_dense_replace", "expert_hidden_dim", "route_norm") if getattr(hf_config, f, None) is None]
    if missing:
        raise ValueError(f"hy_v3 config.json lacks {', '.join(missing)}, which vLLM's HYV3ForCausalLM (the rollout) "
                         "reads; use the config.json that came with the model")
    pattern = hy_v3_moe_layer_pattern(hf_config)
    first = hf_config.first_k_dense_replace
    if pattern != [int(i >= first) for i in range(len(pattern))]:
        raise ValueError(f"hy_v3 first_k_dense_replace={first} (vLLM's dense layers) disagrees with mlp_layer_types "
                         f"{getattr(hf_config, 'mlp_layer_types', None)!r} (HF's; null: the first layer dense)")
    if hf_config.expert_hidden_dim != getattr(hf_config, "moe_intermediate_size", 1536):
        raise ValueError(f"hy_v3 expert_hidden_dim={hf_config.expert_hidden_dim} (vLLM's expert size) differs from "
                         f"moe_intermediate_size={getattr(hf_config, 'moe_intermediate_size', 1536)} (HF's)")
    if not hf_config.route_norm:
        raise ValueError("hy_v3 route_norm=false is not supported (HF renormalises the top-k weights whatever it "
                         "says, vLLM then does not)")
    if not getattr(hf_config, "qk_norm", False):
        raise ValueError("hy_v3 without qk_norm=true is not supported (HF applies the q/k norms whatever it says, "
                         "vLLM only with qk_norm=true)")
