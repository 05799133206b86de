"""Parameter counts from config.json vs the sum of numel of the HF model built from it."""

from __future__ import annotations

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
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_param_count_matches_hf_model(name):
    config = CONFIGS[name]()
    model = T.AutoModelForCausalLM.from_config(config)
    reference = sum(p.numel() for p in model.parameters())  # tied weights are counted once
    assert count_params(ModelShape.from_hf_config(config.to_dict())).total == reference


def test_hand_counted_tiny_qwen2():
    # vocab 1000, hidden 64, ffn 128, 2 layers, 4 heads x 16, 2 kv heads, tied:
    # attention 64*(64+2*32) + 64*64 + q/k/v bias (64+2*32) = 12416; norms 2*64; MLP 3*64*128 = 24576
    # -> 37120 per layer; 2 layers + embedding 64000 + final norm 64 = 138304
    shape = ModelShape.from_hf_config(dict(model_type="qwen2", vocab_size=1000, hidden_size=64, intermediate_size=128,
                                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                           tie_word_embeddings=True))
    assert count_params(shape).total == 138304
