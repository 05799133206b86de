"""megarl's converter tables name the same HF tensors as mbridge 0.15.1 (verl's ``use_mbridge``)
for every megatron parameter mbridge maps, on the transformer-engine spelling mbridge uses.

An independent reference for the name tables: mbridge's per-family name maps were written
separately (for Megatron-LM training). mbridge's Qwen-MoE and Mixtral bridges map no dense-MLP
layer of a MoE model (they assume every layer is MoE); those rules are checked by the HF
forward tests only.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from megatron.core.transformer.transformer_config import TransformerConfig

from megarl.models.converters import build_plan
from megarl.models.moe_config import MOE_MODEL_TYPES, moe_layer_pattern, num_experts

mbridge = pytest.importorskip("mbridge")

_SIZES = dict(vocab_size=32, hidden_size=16, num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1)
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(intermediate_size=24, **_SIZES),
    "qwen2": lambda: transformers.Qwen2Config(intermediate_size=24, tie_word_embeddings=False, **_SIZES),
    "qwen3": lambda: transformers.Qwen3Config(intermediate_size=24, head_dim=8, tie_word_embeddings=False, **_SIZES),
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(
        intermediate_size=24, moe_intermediate_size=8, num_experts=4, num_experts_per_tok=2, head_dim=8,
        mlp_only_layers=[0], **_SIZES),
    "qwen2_moe": lambda: transformers.Qwen2MoeConfig(
        intermediate_size=24, moe_intermediate_size=8, shared_expert_intermediate_size=12, num_experts=4,
        num_experts_per_tok=2, mlp_only_layers=[0], **_SIZES),
    "mixtral": lambda: transformers.MixtralConfig(intermediate_size=24, num_local_experts=4, num_experts_per_tok=2,
                                                  **_SIZES),
    "glm4_moe": lambda: transformers.Glm4MoeConfig(
        intermediate_size=24, moe_intermediate_size=8, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        first_k_dense_replace=1, use_qk_norm=True, attention_bias=True, **_SIZES),
    "deepseek_v3": lambda: transformers.DeepseekV3Config(
        intermediate_size=24, moe_intermediate_size=8, q_lora_rank=12, kv_lora_rank=8, qk_nope_head_dim=8,
        qk_rope_head_dim=4, v_head_dim=8, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        first_k_dense_replace=1, n_group=2, topk_group=1, **{**_SIZES, "num_key_value_heads": 2}),
}
# local-spec name suffix -> transformer-engine spelling (what mbridge maps)
_TE_NAMES = {"input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight"}
_TE_MLA = {"self_attention.q_layernorm.weight": "self_attention.linear_q_up_proj.layer_norm_weight",
           "self_attention.kv_layernorm.weight": "self_attention.linear_kv_up_proj.layer_norm_weight"}
_TE_DENSE = {"pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight"}


def _te_name(entry, dense_layer: bool, mla: bool) -> str:
    name = entry.mcore_name
    if entry.layer is not None:
        local = name.split(".")[2]
        name = name.replace(f"decoder.layers.{local}.", f"decoder.layers.{entry.layer}.", 1)
    for local, te in {**(_TE_MLA if mla else _TE_NAMES), **(_TE_DENSE if dense_layer else {})}.items():
        if name.endswith(local):
            return name[: -len(local)] + te
    if entry.expert is not None:  # local_experts.{e}.linear_fcN.weight -> linear_fcN.weight{e}
        head, _, tail = name.partition("local_experts.")
        return head + tail.split(".", 1)[1] + str(entry.expert)
    return name


@pytest.mark.parametrize("family", list(CONFIGS))
def test_tables_match_mbridge_name_maps(family):
    from mbridge import AutoBridge
    from mbridge.core.parallel_states import ParallelStates

    hf = CONFIGS[family]()
    if family == "deepseek_v3":
        # mbridge 0.15.1's DeepSeek-V3 bridge cannot build its config here (it reads transformers 4's
        # `rope_theta` and passes megatron-core 0.16 an unknown `max_position_embeddings`): its name
        # maps need none of it.
        from mbridge.models import DeepseekV3Bridge

        bridge = DeepseekV3Bridge.__new__(DeepseekV3Bridge)
        bridge.hf_config = hf
    else:
        bridge = AutoBridge.from_config(hf, dtype=torch.float32, parallel_states=ParallelStates())
    experts = num_experts(hf) if hf.model_type in MOE_MODEL_TYPES else None
    mcore = TransformerConfig(num_layers=3, hidden_size=16, num_attention_heads=2, num_moe_experts=experts,
                              pipeline_dtype=torch.float32)
    dense_layers = {i for i, moe in enumerate(moe_layer_pattern(hf)) if not moe} if experts else {0, 1, 2}
    checked, unmapped = 0, []
    for entry in build_plan(hf, mcore):
        dense = entry.layer in dense_layers
        te = _te_name(entry, dense, mla=hf.model_type == "deepseek_v3")
        try:
            names = tuple(bridge._weight_name_mapping_mcore_to_hf(te))
        except NotImplementedError:
            unmapped.append(te)
            continue
        assert names == entry.hf_names, te
        checked += 1
    assert checked > 10
    # mbridge's gap: the dense-MLP layer of a MoE model
    assert all(".mlp.linear_fc" in n and int(n.split(".")[2]) in dense_layers and experts for n in unmapped), unmapped
