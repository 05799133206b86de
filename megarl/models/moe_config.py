"""HF mixture-of-experts fields -> megatron ``TransformerConfig`` MoE fields.

Families: ``mixtral``, ``qwen2_moe``, ``qwen3_next`` and ``qwen3_5_moe_text`` (shared expert with a sigmoid gate),
``qwen3_moe``,
``glm4_moe`` (GLM-4.5) and ``deepseek_v3`` (its MoE; MLA in :mod:`megarl.models.mla_config`):
sigmoid router with a score-correction bias, shared experts, dense first layers; ``nemotron_h`` (the same routing
over non-gated experts, MoE layers where its layer pattern says: :mod:`megarl.models.nemotron_h`); ``hy_v3`` (Hy3: the
same routing without groups, :mod:`megarl.models.hy_v3`); ``gpt_oss`` (its
router and expert biases and clamped GLU in :mod:`megarl.models.gpt_oss`).

* Routing. HF: softmax over all experts, top-k; Mixtral always renormalises the k weights,
  Qwen iff ``norm_topk_prob`` (Qwen3.5-MoE always); GPT-OSS takes the top-k logits, then their softmax (the same). Megatron: ``moe_router_pre_softmax=False`` is top-k then
  softmax over the k (= softmax, top-k, renormalise); ``True`` is softmax then top-k.
  GLM-4.5 / DeepSeek-V3 / Hy3: sigmoid scores, top-k of ``scores + e_score_correction_bias`` (megatron's expert
  bias, loaded and exported as a buffer, frozen: ``moe_router_bias_update_rate=0``, as HF and
  vLLM never change it), weights renormalised (megatron: only for top-k > 1, so HF's renormalised
  top-1 is refused) and scaled by ``routed_scaling_factor`` (Hy3:
  ``router_scaling_factor``); routing
  groups (``n_group`` / ``topk_group``) where megatron's group score (sum of the top
  ``topk / topk_group`` scores of a group) is HF's (sum of the top 2).
* Dense layers. Qwen's ``mlp_only_layers`` and ``decoder_sparse_step`` (layer ``i`` is MoE
  iff ``i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0``) and GLM's / DeepSeek's
  ``first_k_dense_replace`` and Hy3's ``mlp_layer_types`` become ``moe_layer_freq`` as a 0/1 list; dense layers use
  ``intermediate_size``.
* Load-balancing loss. HF adds ``router_aux_loss_coef * aux`` to the loss iff
  ``output_router_logits``; so megatron's ``aux_loss`` is on exactly then. HF's ``aux`` is
  ``E * sum_e f_e P_e`` with ``f_e`` the fraction of *tokens* routed to ``e`` (summing to
  top-k), megatron's has ``f_e`` as the fraction of *assignments* (summing to 1): the
  coefficient is multiplied by top-k so that one MoE layer gives HF's loss term exactly.
  With several MoE layers HF pools the router statistics of all layers into one term,
  megatron adds one term per layer (Switch-Transformer style); padded tokens count in
  megatron's term (megarl packs sequences, so there are none but alignment padding).
  HF configs of these families have no z-loss field; ``moe_z_loss_coeff`` is set through
  ``megatron.override_transformer_config`` (as are all these fields).
* Experts. Sequential experts (``SequentialMLP``) on the local spec; grouped GEMM
  (transformer-engine ``TEGroupedMLP``) where the transformer-engine spec runs (CUDA with TE).

mbridge 0.15.1 (verl's ``use_mbridge``) builds these configs too but is not used for them:
it sets ``moe_router_load_balancing_type="none"`` whatever the HF config says (GLM:
``seq_aux_loss``), ignores ``mlp_only_layers`` / ``decoder_sparse_step`` (every layer MoE),
gives Mixtral ``moe_router_pre_softmax=True`` (no renormalisation of the top-k weights: wrong
routing weights for Mixtral), Qwen2-MoE no ``moe_shared_expert_gate`` (the HF sigmoid gate
dropped), GLM-4.5 no routing groups and one shared expert whatever ``n_shared_experts`` says,
and its DeepSeek-V3 config does not build with megatron-core 0.16.1.
"""

from __future__ import annotations

from typing import Any

from megarl.compat.megatron_core.cpu import MOE_DISPATCHER_ON_CPU
from megarl.models.hy_v3 import HY_V3_MODEL_TYPES, check_hy_v3_supported, hy_v3_moe_layer_pattern

__all__ = ["MOE_MODEL_TYPES", "check_moe_supported", "moe_layer_pattern", "moe_layers", "moe_transformer_kwargs",
           "num_experts"]

MOE_MODEL_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "glm4_moe", "deepseek_v3", "gpt_oss", "qwen3_next",
                   "qwen3_5_moe_text", "nemotron_h", *HY_V3_MODEL_TYPES)
# Families with one shared expert behind a sigmoid gate (Qwen2-MoE's, Qwen3-Next's)
_GATED_SHARED_EXPERT = ("qwen2_moe", "qwen3_next", "qwen3_5_moe_text")
# Families routed like DeepSeek-V3 (sigmoid + score-correction bias, groups, scaling, shared experts)
_DEEPSEEK_ROUTED = ("glm4_moe", "deepseek_v3", "nemotron_h")
_SIGMOID_ROUTED = (*_DEEPSEEK_ROUTED, *HY_V3_MODEL_TYPES)


def num_experts(hf_config) -> int:
    return (getattr(hf_config, "num_experts", None) or getattr(hf_config, "num_local_experts", None)
            or hf_config.n_routed_experts)


def moe_layer_pattern(hf_config) -> list[int]:
    """Per decoder layer: 1 = MoE, 0 = dense MLP (``[num_hidden_layers]``)."""
    if hf_config.model_type in HY_V3_MODEL_TYPES:
        return hy_v3_moe_layer_pattern(hf_config)
    if hf_config.model_type == "nemotron_h":  # its MoE layers are the pattern's 'E' (megarl.models.nemotron_h)
        from megarl.config.rules.model import nemotron_h_layer_kinds

        return [int(kind == "moe") for kind in nemotron_h_layer_kinds(vars(hf_config)) or ()]
    if hf_config.model_type in _DEEPSEEK_ROUTED:
        first = getattr(hf_config, "first_k_dense_replace", 0) or 0
        return [int(i >= first) for i in range(hf_config.num_hidden_layers)]
    dense = set(getattr(hf_config, "mlp_only_layers", None) or ())
    step = getattr(hf_config, "decoder_sparse_step", 1) or 1
    return [int(i not in dense and (i + 1) % step == 0) for i in range(hf_config.num_hidden_layers)]


def moe_layers(hf_config) -> list[int]:
    """Decoder index of each MoE layer, in order: the layer axis of recorded routes (vLLM's ``layer_id``,
    megatron's ``TopKRouter.layer_number - 1``)."""
    return [i for i, moe in enumerate(moe_layer_pattern(hf_config)) if moe]


def check_moe_supported(hf_config) -> None:
    """Raise ValueError naming the config.json field megarl cannot honour."""
    model_type = hf_config.model_type
    if model_type == "mixtral" and getattr(hf_config, "router_jitter_noise", 0.0):
        raise ValueError("mixtral router_jitter_noise > 0 is not supported (megatron has no such router noise); set it to 0")
    if model_type == "qwen2_moe" and getattr(hf_config, "use_sliding_window", False):
        raise ValueError("qwen2_moe use_sliding_window=true is not supported; set it to false")
    if model_type in _GATED_SHARED_EXPERT and not getattr(hf_config, "shared_expert_intermediate_size", 0):
        raise ValueError(f"{model_type} without a shared expert (shared_expert_intermediate_size=0) is not supported")
    if model_type in HY_V3_MODEL_TYPES:
        check_hy_v3_supported(hf_config)
    if model_type in _DEEPSEEK_ROUTED:
        # getattr: the preflight check runs on the raw config.json (transformers fills defaults later)
        topk = getattr(hf_config, "num_experts_per_tok", 1)
        groups, group_topk = getattr(hf_config, "n_group", 1) or 1, getattr(hf_config, "topk_group", 1) or 1
        if not getattr(hf_config, "n_shared_experts", 1):
            raise ValueError(f"{model_type} without shared experts (n_shared_experts=0) is not supported")
        if topk > 1 and not getattr(hf_config, "norm_topk_prob", True):
            raise ValueError(f"{model_type} norm_topk_prob=false is not supported (megatron's sigmoid router "
                             "renormalises the top-k weights)")
        if topk == 1 and getattr(hf_config, "norm_topk_prob", True):
            # megatron-core 0.19.2 (moe_utils.topk_routing_with_score_function) renormalises only when topk > 1
            raise ValueError(f"{model_type} num_experts_per_tok=1 with norm_topk_prob=true is not supported (HF "
                             "renormalises the one routed weight to 1, megatron's sigmoid router keeps its score and "
                             "has no setting to renormalise it); megarl runs this family with num_experts_per_tok >= 2, "
                             "or 1 with norm_topk_prob=false where the model was trained so")
        if groups > 1 and topk // group_topk != 2:
            raise ValueError(f"{model_type} n_group={groups} with num_experts_per_tok / topk_group != 2 is not "
                             "supported (HF scores a group by its top-2 experts, megatron by its top "
                             "num_experts_per_tok / topk_group)")
    if not any(moe_layer_pattern(hf_config)):
        raise ValueError(f"{model_type} with no MoE layer (mlp_only_layers / decoder_sparse_step) is not supported")


def moe_transformer_kwargs(hf_config, *, grouped_gemm: bool, on_cpu: bool) -> dict[str, Any]:
    """TransformerConfig keyword arguments of an MoE family (see the module docstring)."""
    model_type = hf_config.model_type
    topk = hf_config.num_experts_per_tok
    # Qwen3.5-MoE always renormalises (it has no norm_topk_prob)
    renormalise = model_type in ("mixtral", "gpt_oss", "qwen3_5_moe_text") or bool(getattr(hf_config, "norm_topk_prob", False))
    pattern = moe_layer_pattern(hf_config)
    # GLM-4.5 / DeepSeek-V3 / Hy3 balance through the router bias; HF computes no load-balancing loss for them
    aux = model_type not in _SIGMOID_ROUTED and bool(getattr(hf_config, "output_router_logits", False)) and float(
        getattr(hf_config, "router_aux_loss_coef", 0.0)) > 0
    kwargs: dict[str, Any] = dict(
        num_moe_experts=num_experts(hf_config),
        moe_router_topk=topk,
        moe_ffn_hidden_size=getattr(hf_config, "moe_intermediate_size", None) or hf_config.intermediate_size,
        moe_layer_freq=1 if all(pattern) else pattern,
        moe_router_pre_softmax=not renormalise,
        moe_router_score_function="softmax",
        moe_router_load_balancing_type="aux_loss" if aux else "none",
        moe_aux_loss_coeff=float(hf_config.router_aux_loss_coef) * topk if aux else 0.0,
        moe_grouped_gemm=grouped_gemm,
        # TE's fused token permute/unpermute stays off unless override_transformer_config.moe_permute_fusion
        # asks: it was slower on the small MoE models measured (benchmarks/RESULTS.md)
        moe_token_dispatcher_type=MOE_DISPATCHER_ON_CPU if on_cpu else "alltoall",
    )
    if model_type in _GATED_SHARED_EXPERT:
        kwargs.update(moe_shared_expert_intermediate_size=hf_config.shared_expert_intermediate_size,
                      moe_shared_expert_gate=True)
    if model_type in _SIGMOID_ROUTED:
        hy_v3 = model_type in HY_V3_MODEL_TYPES  # Hy3: no routing groups, its own field names
        groups = 1 if hy_v3 else hf_config.n_group
        scaling = hf_config.router_scaling_factor if hy_v3 else hf_config.routed_scaling_factor
        shared = hf_config.num_shared_experts if hy_v3 else hf_config.n_shared_experts
        kwargs.update(
            moe_router_score_function="sigmoid",
            moe_router_pre_softmax=False,
            moe_router_enable_expert_bias=True,
            moe_router_bias_update_rate=0.0,
            moe_router_topk_scaling_factor=float(scaling),
            moe_router_num_groups=groups if groups > 1 else None,
            moe_router_group_topk=hf_config.topk_group if groups > 1 else None,
            moe_router_dtype="fp32",  # HF routes in fp32
            moe_shared_expert_intermediate_size=hf_config.moe_intermediate_size * shared,
        )
    if model_type == "nemotron_h":  # one shared expert of its own size, whatever n_shared_experts says (as HF)
        kwargs["moe_shared_expert_intermediate_size"] = hf_config.moe_shared_expert_intermediate_size
    return kwargs
