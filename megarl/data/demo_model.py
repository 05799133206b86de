"""The demo policy: a tiny Qwen2-shaped causal LM with seeded random weights (the demo dir
holds it after its warm-up on the task: ``megarl.data.demo_warmup``).

Shape: hidden 128, 2 layers, 4 query heads and 2 KV heads of head_dim 32 (vLLM's CPU
attention needs head_dim >= 32), MLP 256, 128 positions, untied embeddings, float32,
vocabulary = the demo tokenizer's 64 entries.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

MODEL_SEED = 0


def demo_model_config(tokenizer: PreTrainedTokenizerBase) -> Qwen2Config:
    """The Qwen2Config of the demo model, with special-token ids taken from ``tokenizer``."""
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=256,
        max_position_embeddings=128,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )


def build_demo_model(tokenizer: PreTrainedTokenizerBase, seed: int = MODEL_SEED) -> Qwen2ForCausalLM:
    """Random-init demo model; the same ``seed`` gives the same weights (caller's RNG untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(demo_model_config(tokenizer))
    return model.to(torch.float32).eval()
