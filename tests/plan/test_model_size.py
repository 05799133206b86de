"""Parameter counts from config.json vs the sum of numel of the HF model built from it, and vs
the totals the model makers publish for real configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers as T

from megarl.plan.model_size import ModelShape, count_params

COMMON = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2)
CONFIGS = {
    "qwen2_tied": lambda: T.Qwen2Config(num_hidden_layers=3, tie_word_embeddings=True, **COMMON),
    "qwen3_untied_head_dim": lambda: T.Qwen3Config(num_hidden_layers=3, head_dim=32, tie_word_embeddings=False, **COMMON),
    "llama_bias_mha": lambda: T.LlamaConfig(num_hidden_layers=2, attention_bias=True,
                                            **{**COMMON, "num_key_value_heads": 4}),
    "mixtral": lambda: T.MixtralConfig(num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2, **COMMON),
    "qwen2_moe_shared_dense_layer": lambda: T.Qwen2MoeConfig(
        num_hidden_layers=3, moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=4,
        num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[1], **COMMON),
    "qwen3_moe": lambda: T.Qwen3MoeConfig(num_hidden_layers=2, moe_intermediate_size=32, head_dim=16, num_experts=4,
                                          num_experts_per_tok=2, **COMMON),
    # MLA with a q latent, two dense layers first, 2 shared experts, router bias (a buffer)
    "deepseek_v3_q_lora": lambda: T.DeepseekV3Config(
        num_hidden_layers=4, first_k_dense_replace=2, n_routed_experts=8, n_shared_experts=2, num_experts_per_tok=2,
        moe_intermediate_size=24, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
        v_head_dim=12, n_group=1, topk_group=1, **COMMON),
    # Moonlight's form: no q latent (q_proj), attention biases on q_a / kv_a / o
    "deepseek_v3_no_q_lora_bias": lambda: T.DeepseekV3Config(
        num_hidden_layers=2, first_k_dense_replace=1, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
        moe_intermediate_size=24, q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
        v_head_dim=12, n_group=1, topk_group=1, attention_bias=True, **COMMON),
    "deepseek_v2": lambda: T.DeepseekV2Config(
        num_hidden_layers=3, first_k_dense_replace=1, n_routed_experts=4, n_shared_experts=2, num_experts_per_tok=2,
        moe_intermediate_size=24, q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
        v_head_dim=12, **COMMON),
    # GLM-4.5: q/k/v biases (none on o), q/k norms, one dense layer first, router bias (a buffer)
    # GPT-OSS: q/k/v/o biases, attention sinks, router bias, expert biases (experts stacked in one tensor)
    "gpt_oss": lambda: T.GptOssConfig(num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2, head_dim=16,
                                      **COMMON),
    # Qwen3.5 text: three gated DeltaNet layers, one gated-attention layer (q_proj holds a gate per head)
    "qwen3_5_text": lambda: T.Qwen3_5TextConfig(
        num_hidden_layers=4, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=12, linear_conv_kernel_dim=4, tie_word_embeddings=True, **COMMON),
    "qwen3_5_moe_text": lambda: T.Qwen3_5MoeTextConfig(
        num_hidden_layers=4, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=12, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
        shared_expert_intermediate_size=40, **COMMON),
    # Qwen3-Next: the same hybrid (every 2nd layer full attention), MoE with a gated shared expert in every layer
    "qwen3_next": lambda: T.Qwen3NextConfig(
        num_hidden_layers=4, full_attention_interval=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=8, linear_value_head_dim=12, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
        shared_expert_intermediate_size=40, **COMMON),
    # Hy3: q/k norms, the first layer dense (HF's default mlp_layer_types), 2 shared experts, router bias (a buffer)
    "hy_v3": lambda: T.HYV3Config(num_hidden_layers=3, num_experts=4, num_shared_experts=2, num_experts_per_tok=2,
                                  moe_intermediate_size=24, head_dim=16, **COMMON),
    # Nemotron-H: one block per layer (Mamba-2, attention, squared-ReLU MLP, MoE with a shared expert), one norm each
    "nemotron_h": lambda: T.NemotronHConfig(
        layers_block_type=["linear_attention", "full_attention", "mlp", "moe", "linear_attention"], head_dim=16,
        mamba_num_heads=8, mamba_head_dim=8, n_groups=2, ssm_state_size=16, n_routed_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=24, moe_shared_expert_intermediate_size=40, tie_word_embeddings=False, **COMMON),
    "glm4_moe": lambda: T.Glm4MoeConfig(
        num_hidden_layers=3, first_k_dense_replace=1, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
        moe_intermediate_size=24, head_dim=16, attention_bias=True, use_qk_norm=True, partial_rotary_factor=0.5,
        **COMMON),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_param_count_matches_hf_model(name):
    config = CONFIGS[name]()
    model = T.AutoModelForCausalLM.from_config(config)
    reference = sum(p.numel() for p in model.parameters())  # tied weights are counted once
    # the sigmoid routers' score-correction bias is a buffer in HF (and megatron), counted by the plan
    reference += sum(b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
    assert count_params(ModelShape.from_hf_config(config.to_dict())).total == reference


def test_hand_counted_tiny_qwen2():
    # vocab 1000, hidden 64, ffn 128, 2 layers, 4 heads x 16, 2 kv heads, tied:
    # attention 64*(64+2*32) + 64*64 + q/k/v bias (64+2*32) = 12416; norms 2*64; MLP 3*64*128 = 24576
    # -> 37120 per layer; 2 layers + embedding 64000 + final norm 64 = 138304
    shape = ModelShape.from_hf_config(dict(model_type="qwen2", vocab_size=1000, hidden_size=64, intermediate_size=128,
                                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                           tie_word_embeddings=True))
    assert count_params(shape).total == 138304


# Published configs (config.json of each HF repo; values copied into the fixture, sources named)
# and the totals / active counts their makers publish.
QWEN25_7B = dict(  # Qwen/Qwen2.5-7B config.json; 7.61 B ("7.62B" with the untied head, Qwen2.5 report)
    model_type="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
    num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False)
MIXTRAL_8X7B = dict(  # mistralai/Mixtral-8x7B-v0.1 config.json; 46.7 B total, 12.9 B active (Mistral's post)
    model_type="mixtral", vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
    tie_word_embeddings=False)
QWEN3_30B_A3B = dict(  # Qwen/Qwen3-30B-A3B config.json; 30.5 B total, 3.3 B active (its model card)
    model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
    num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
    num_experts_per_tok=8, decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False)
DEEPSEEK_V3 = dict(  # deepseek-ai/DeepSeek-V3 config.json; 671 B total (+ 14 B MTP module), 37 B active (its card)
    model_type="deepseek_v3", vocab_size=129280, hidden_size=7168, intermediate_size=18432,
    moe_intermediate_size=2048, num_hidden_layers=61, num_nextn_predict_layers=1, first_k_dense_replace=3,
    moe_layer_freq=1, num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536, kv_lora_rank=512,
    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=256, n_shared_experts=1,
    num_experts_per_tok=8, n_group=8, topk_group=4, topk_method="noaux_tc", scoring_func="sigmoid",
    norm_topk_prob=True, attention_bias=False, tie_word_embeddings=False)
MOONLIGHT_16B_A3B = dict(  # moonshotai/Moonlight-16B-A3B config.json; 16 B total, 3 B active (its card)
    model_type="deepseek_v3", vocab_size=163840, hidden_size=2048, intermediate_size=11264,
    moe_intermediate_size=1408, num_hidden_layers=27, first_k_dense_replace=1, moe_layer_freq=1,
    num_attention_heads=16, num_key_value_heads=16, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128,
    qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=64, n_shared_experts=2, num_experts_per_tok=6,
    n_group=1, topk_group=1, topk_method="noaux_tc", scoring_func="sigmoid", attention_bias=False,
    tie_word_embeddings=False)
# zai-org/GLM-4.5-Air and zai-org/GLM-4.5 config.json (the same values in Megatron-Bridge's
# glm45_provider.py: GLM45AirModelProvider106B / GLM45ModelProvider355B); 106 B / 12 B active and
# 355 B / 32 B active (their cards; GLM counts active parameters without embedding and LM head)
GLM45_AIR = dict(
    model_type="glm4_moe", vocab_size=151552, hidden_size=4096, intermediate_size=10944, moe_intermediate_size=1408,
    num_hidden_layers=46, first_k_dense_replace=1, num_attention_heads=96, num_key_value_heads=8, head_dim=128,
    n_routed_experts=128, n_shared_experts=1, num_experts_per_tok=8, n_group=1, topk_group=1, attention_bias=True,
    use_qk_norm=False, partial_rotary_factor=0.5, num_nextn_predict_layers=1, tie_word_embeddings=False)
GLM45 = {**GLM45_AIR, "hidden_size": 5120, "intermediate_size": 12288, "moe_intermediate_size": 1536,
         "num_hidden_layers": 92, "first_k_dense_replace": 3, "n_routed_experts": 160, "use_qk_norm": True}

# openai/gpt-oss-20b config.json (tests/fixtures/verl_scripts/models/gpt-oss-20b) and gpt-oss-120b's (36 layers,
# 128 experts, the rest alike); 20.91 B / 3.61 B active and 116.83 B / 5.13 B active (OpenAI's model card, whose
# active counts leave the embedding out and keep the unembedding)
GPT_OSS_20B = dict(
    model_type="gpt_oss", vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=24,
    num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=32, num_experts_per_tok=4,
    sliding_window=128, tie_word_embeddings=False)
GPT_OSS_120B = {**GPT_OSS_20B, "num_hidden_layers": 36, "num_local_experts": 128}

# Qwen/Qwen3-Next-80B-A3B-Instruct config.json (tests/fixtures/verl_scripts/models/Qwen3-Next-80B-A3B: no
# layer_types, full_attention_interval 4); 80 B total (its card; its multi-token-prediction layer not counted)
QWEN3_NEXT_80B = dict(
    model_type="qwen3_next", vocab_size=151936, hidden_size=2048, intermediate_size=5120, moe_intermediate_size=512,
    shared_expert_intermediate_size=512, num_hidden_layers=48, full_attention_interval=4, num_attention_heads=16,
    num_key_value_heads=2, head_dim=256, linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_num_key_heads=16,
    linear_num_value_heads=32, linear_value_head_dim=128, num_experts=512, num_experts_per_tok=10, decoder_sparse_step=1,
    tie_word_embeddings=False)

# tencent/Hy3 (tests/fixtures/verl_scripts/models/Hy3, see its SOURCES.md); 295 B total, 21 B active (its card;
# its 3.8 B multi-token-prediction layer not counted)
HY3 = T.HYV3Config().to_dict()  # its defaults are the released model's sizes

# nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 (tests/fixtures/verl_scripts/models/Nemotron-3-Nano-30B-A3B): 31.6 B
# total, 3.6 B active with the embeddings (its card)
NEMOTRON_3_NANO = json.loads((Path(__file__).parents[1] / "fixtures" / "verl_scripts" / "models" /
                              "Nemotron-3-Nano-30B-A3B" / "config.json").read_text())

PUBLISHED = {  # name: (config, total, active or None, what the active count leaves out)
    "Qwen2.5-7B": (QWEN25_7B, 7.62e9, None, ()),
    "Mixtral-8x7B": (MIXTRAL_8X7B, 46.7e9, 12.9e9, ()),
    "Qwen3-30B-A3B": (QWEN3_30B_A3B, 30.5e9, 3.3e9, ()),
    "DeepSeek-V3": (DEEPSEEK_V3, 671e9, 37e9, ()),
    "Moonlight-16B-A3B": (MOONLIGHT_16B_A3B, 16e9, 3e9, ()),
    "GLM-4.5-Air": (GLM45_AIR, 106e9, 12e9, ("embedding", "lm_head")),
    "GLM-4.5": (GLM45, 355e9, 32e9, ("embedding", "lm_head")),
    "gpt-oss-20b": (GPT_OSS_20B, 20.91e9, 3.61e9, ("embedding",)),
    "gpt-oss-120b": (GPT_OSS_120B, 116.83e9, 5.13e9, ("embedding",)),
    "Qwen3-Next-80B-A3B": (QWEN3_NEXT_80B, 80e9, None, ()),
    "Hy3": (HY3, 295e9, 21e9, ()),
    "Nemotron-3-Nano-30B-A3B": (NEMOTRON_3_NANO, 31.6e9, 3.6e9, ()),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_totals(name):
    config, total, active, left_out = PUBLISHED[name]
    p = count_params(ModelShape.from_hf_config(config))
    assert p.total == pytest.approx(total, rel=0.015)
    if active is not None:
        counted = p.active - sum(getattr(p, part) for part in left_out)
        # published active counts are rounded to one or two digits ("3B", "12B")
        assert counted == pytest.approx(active, rel=0.05 if active < 10e9 else 0.02)


def test_qwen25_7b_exact():
    assert count_params(ModelShape.from_hf_config(QWEN25_7B)).total == 7_615_616_512
