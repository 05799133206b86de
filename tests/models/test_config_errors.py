"""Bad configuration gives errors that name the key (no processes)."""

from __future__ import annotations

import pytest
import torch
import transformers

from megarl.models.config import hf_to_transformer_config, padded_vocab_size


def test_unsupported_architecture_names_model_type():
    config = transformers.GPT2Config()
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        hf_to_transformer_config(config, {}, device="cpu", dtype=torch.float32)


def test_padded_vocab_size():
    assert padded_vocab_size(96, 2) == 96
    assert padded_vocab_size(97, 2) == 98
    assert padded_vocab_size(97, 4) == 100


@pytest.mark.parametrize("name", ["flash", "fused", "unfused", "local", "auto"])
def test_attention_backend_reaches_megatron_as_its_enum(name):
    from megatron.core.transformer.enums import AttnBackend

    from megarl.models.config import transformer_overrides

    got = transformer_overrides({"attention_backend": name, "recompute_granularity": None})
    assert got == {"attention_backend": AttnBackend[name], "recompute_granularity": None}
    with pytest.raises(ValueError, match="recompute_granularty"):
        transformer_overrides({"recompute_granularty": "full"})


def test_not_yet_supported_families_say_why_and_list_the_supported():
    with pytest.raises(ValueError, match=r"'gemma3'.*vision tower.*gemma3_text.*supported: .*gemma3_text.*deepseek_v3"):
        hf_to_transformer_config(transformers.Gemma3Config(), {}, device="cpu", dtype=torch.float32)


@pytest.mark.parametrize("field, value, match", [
    ("attn_logit_softcapping", 50.0, "attn_logit_softcapping=50.0"),
    ("final_logit_softcapping", 30.0, "final_logit_softcapping=30.0"),
    ("hidden_activation", "gelu", "hidden_activation 'gelu'"),
    ("use_bidirectional_attention", True, "use_bidirectional_attention"),
])
def test_gemma3_options_megarl_does_not_implement_are_refused(field, value, match):
    config = transformers.Gemma3TextConfig()
    setattr(config, field, value)
    with pytest.raises(ValueError, match=match):
        hf_to_transformer_config(config, {}, device="cpu", dtype=torch.float32)


def test_deepseek_v3_scope_is_refused_naming_the_field():
    yarn = transformers.DeepseekV3Config(rope_parameters={"rope_type": "yarn", "factor": 40.0, "rope_theta": 1e4,
                                                          "original_max_position_embeddings": 4096, "mscale": 0.5})
    with pytest.raises(ValueError, match="mscale without mscale_all_dim"):
        hf_to_transformer_config(yarn, {}, device="cpu", dtype=torch.float32)
    with pytest.raises(ValueError, match="transformer_impl=local"):
        from megarl.models.mla_config import check_mla_supported

        check_mla_supported(transformers.DeepseekV3Config(), "transformer_engine")


@pytest.mark.parametrize("config, match", [
    (lambda: transformers.MixtralConfig(router_jitter_noise=0.1), "router_jitter_noise"),
    (lambda: transformers.MixtralConfig(sliding_window=4096), "sliding_window"),
    (lambda: transformers.Qwen2MoeConfig(use_sliding_window=True), "use_sliding_window"),
    (lambda: transformers.Qwen3MoeConfig(num_hidden_layers=2, mlp_only_layers=[0, 1]), "no MoE layer"),
    (lambda: transformers.Glm4MoeConfig(norm_topk_prob=False), "norm_topk_prob"),
    (lambda: transformers.Glm4MoeConfig(n_group=4, topk_group=2, num_experts_per_tok=8), "topk_group"),
    # HF renormalises the single routed weight to 1, megatron keeps its score (log-probs differ by ~2e-2)
    (lambda: transformers.Glm4MoeConfig(num_experts_per_tok=1, n_group=1, topk_group=1), "num_experts_per_tok=1 with norm"),
    (lambda: transformers.DeepseekV3Config(num_experts_per_tok=1, n_group=1, topk_group=1), "num_experts_per_tok=1 with norm"),
])
def test_moe_features_megarl_cannot_honour_are_refused(config, match):
    with pytest.raises(ValueError, match=match):
        hf_to_transformer_config(config(), {}, device="cpu", dtype=torch.float32)


def test_grouped_gemm_needs_the_transformer_engine_spec():
    with pytest.raises(ValueError, match="override_transformer_config.moe_grouped_gemm"):
        hf_to_transformer_config(transformers.MixtralConfig(), {"override_transformer_config": {"moe_grouped_gemm": True}},
                                 device="cpu", dtype=torch.float32)


def test_moe_fields_follow_the_hf_config():
    from megarl.models.moe_config import moe_transformer_kwargs

    qwen3 = transformers.Qwen3MoeConfig(num_hidden_layers=4, mlp_only_layers=[0], decoder_sparse_step=1,
                                        norm_topk_prob=True, num_experts_per_tok=4, router_aux_loss_coef=0.01)
    off = moe_transformer_kwargs(qwen3, grouped_gemm=False, on_cpu=True)
    assert off["moe_layer_freq"] == [0, 1, 1, 1] and off["moe_router_pre_softmax"] is False
    assert off["moe_router_load_balancing_type"] == "none" and off["moe_aux_loss_coeff"] == 0.0
    qwen3.output_router_logits = True
    on = moe_transformer_kwargs(qwen3, grouped_gemm=True, on_cpu=False)
    assert on["moe_router_load_balancing_type"] == "aux_loss" and on["moe_aux_loss_coeff"] == pytest.approx(0.04)
    assert on["moe_grouped_gemm"] is True and on["moe_token_dispatcher_type"] == "alltoall"
    qwen2 = transformers.Qwen2MoeConfig(num_hidden_layers=4, decoder_sparse_step=2, norm_topk_prob=False,
                                        shared_expert_intermediate_size=48)
    kw = moe_transformer_kwargs(qwen2, grouped_gemm=False, on_cpu=True)
    assert kw["moe_layer_freq"] == [0, 1, 0, 1] and kw["moe_router_pre_softmax"] is True
    assert kw["moe_shared_expert_intermediate_size"] == 48 and kw["moe_shared_expert_gate"] is True
    mixtral = moe_transformer_kwargs(transformers.MixtralConfig(intermediate_size=24), grouped_gemm=False, on_cpu=True)
    assert mixtral["moe_router_pre_softmax"] is False and mixtral["moe_layer_freq"] == 1
    assert mixtral["moe_ffn_hidden_size"] == 24
    glm = moe_transformer_kwargs(transformers.Glm4MoeConfig(num_hidden_layers=3, first_k_dense_replace=2,
                                                            n_group=4, topk_group=4, num_experts_per_tok=8,
                                                            n_shared_experts=2, moe_intermediate_size=16),
                                 grouped_gemm=False, on_cpu=True)
    assert glm["moe_layer_freq"] == [0, 0, 1] and glm["moe_router_score_function"] == "sigmoid"
    assert glm["moe_router_enable_expert_bias"] and glm["moe_router_bias_update_rate"] == 0.0
    assert (glm["moe_router_num_groups"], glm["moe_router_group_topk"]) == (4, 4)
    assert glm["moe_shared_expert_intermediate_size"] == 32


def test_top1_routing_is_judged_on_the_raw_config_json():
    """The preflight reads config.json as written: no norm_topk_prob means HF's default (true), refused; top-1
    with norm_topk_prob=false keeps the single score in HF as in megatron, accepted."""
    import types

    from megarl.models.config import unsupported_reason

    raw = {k: v for k, v in transformers.Glm4MoeConfig(num_experts_per_tok=1, n_group=1, topk_group=1).to_dict().items()
           if k != "norm_topk_prob"}
    assert "num_experts_per_tok=1 with norm_topk_prob=true" in unsupported_reason(types.SimpleNamespace(**raw))
    assert unsupported_reason(types.SimpleNamespace(**raw, norm_topk_prob=False)) is None
