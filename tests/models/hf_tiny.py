"""Tiny HF models built from config (no downloads) for the megatron conversion tests."""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import Iterator

import torch
import transformers
from safetensors.torch import load_file

# name -> (config class, extra config kwargs)
TINY = {
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=False)),
    "qwen2_tied": ("Qwen2Config", dict(tie_word_embeddings=True)),
    "llama": ("LlamaConfig", dict(tie_word_embeddings=False, rope_theta=500000.0)),
    "qwen3": ("Qwen3Config", dict(tie_word_embeddings=True, head_dim=16)),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        dict(
            tie_word_embeddings=False,
            head_dim=16,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        ),
    ),
    # Dense first layer, load-balancing loss on (output_router_logits), renormalised top-k.
    "qwen3_moe_dense0": (
        "Qwen3MoeConfig",
        dict(tie_word_embeddings=False, head_dim=16, num_experts=4, num_experts_per_tok=2,
             moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[0],
             output_router_logits=True, router_aux_loss_coef=0.05),
    ),
    # Shared expert with its sigmoid gate, dense first layer, top-k weights not renormalised.
    "qwen2_moe": (
        "Qwen2MoeConfig",
        dict(tie_word_embeddings=False, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
             shared_expert_intermediate_size=48, norm_topk_prob=False, mlp_only_layers=[0]),
    ),
    "mixtral": (
        "MixtralConfig",
        dict(tie_word_embeddings=False, num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
    ),
    # GLM-4.5 shape: dense first layer, sigmoid router with score-correction bias and scaling,
    # shared expert, QK norm, QKV bias, rotary on half of each head.
    "glm4_moe": (
        "Glm4MoeConfig",
        dict(tie_word_embeddings=False, head_dim=16, n_routed_experts=4, num_experts_per_tok=2,
             moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
             norm_topk_prob=True, routed_scaling_factor=2.5, use_qk_norm=True, attention_bias=True,
             num_nextn_predict_layers=0),
    ),
    # DeepSeek-V3 shape: MLA (q LoRA), dense first layer, sigmoid router with bias, 2 groups.
    "deepseek_v3": (
        "DeepseekV3Config",
        dict(tie_word_embeddings=False, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16,
             qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2,
             moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1,
             norm_topk_prob=True, routed_scaling_factor=2.5, rope_interleave=True,
             # YaRN as DeepSeek-V3 ships it (factor 40, mscale = mscale_all_dim), scaled down
             rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                              "original_max_position_embeddings": 32, "beta_fast": 32, "beta_slow": 1,
                              "mscale": 1.0, "mscale_all_dim": 1.0}),
    ),
    # Gemma 3 text: sliding window 4 < the batch's 12 tokens, local and global layers interleaved, a
    # softmax scale (query_pre_attn_scalar) other than head_dim, linear rope scaling on global layers.
    # No pad token: HF's embedding would give its row no lookup gradient (padding_idx), megatron's does.
    "gemma3": (
        "Gemma3TextConfig",
        dict(tie_word_embeddings=True, head_dim=16, query_pre_attn_scalar=24, sliding_window=4, pad_token_id=None,
             layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
             rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                              "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 2.0}}),
    ),
    # GPT-OSS: attention sinks, sliding window 4 < the batch's 12 tokens on even layers, biases on q/k/v/o, the
    # router and the experts (stacked in one tensor per layer), YaRN, and a GLU clamp the activations reach.
    "gpt_oss": (
        "GptOssConfig",
        dict(tie_word_embeddings=False, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
             swiglu_limit=0.1,
             rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                              "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 32}),
    ),
    # Qwen3.5 text: gated DeltaNet (2 key heads, 4 value heads) and gated attention layers alternating, zero-centred
    # norms, rotary on a quarter of each head, tied LM head.
    "qwen3_5": (
        "Qwen3_5TextConfig",
        dict(tie_word_embeddings=True, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
             linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
             layer_types=["linear_attention", "full_attention"] * 2),
    ),
    # Qwen3.5-MoE text: Qwen3.5's layers with 4 experts (top-2, always renormalised) and a gated shared expert
    "qwen3_5_moe": (
        "Qwen3_5MoeTextConfig",
        dict(tie_word_embeddings=False, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
             linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
             layer_types=["linear_attention", "full_attention"] * 2, num_experts=4, num_experts_per_tok=2,
             moe_intermediate_size=32, shared_expert_intermediate_size=48),
    ),
    # Qwen3-Next: the same hybrid with key-head-grouped DeltaNet projections, 4 experts (top-2, renormalised) and a
    # gated shared expert in every layer; 4 layers, the 4th full attention (full_attention_interval, no layer_types).
    "qwen3_next": (
        "Qwen3NextConfig",
        dict(tie_word_embeddings=False, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
             linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4, full_attention_interval=4,
             num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
             norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[]),
    ),
    # Hy3: dense first layer (HF's default mlp_layer_types), sigmoid router with score-correction bias and scaling,
    # no groups, a shared expert, per-head QK norm; vLLM's fields (first_k_dense_replace, expert_hidden_dim,
    # route_norm, qk_norm) as the released config.json has them.
    "hy_v3": (
        "HYV3Config",
        dict(tie_word_embeddings=False, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
             num_shared_experts=1, router_scaling_factor=2.826, first_k_dense_replace=1, expert_hidden_dim=32,
             route_norm=True, qk_norm=True),
    ),
    # Nemotron-H: every block kind (Mamba-2, attention without rotary, squared-ReLU MLP, MoE with a shared expert and
    # DeepSeek-V3's sigmoid routing, scaled), 8 Mamba heads in 2 groups, chunks of 4 (< the batch's 12 tokens: the
    # scan carries its state across chunks); transformers' HF names, checkpoint names under backbone.
    "nemotron_h": (
        "NemotronHConfig",
        dict(tie_word_embeddings=False, head_dim=16,
             layers_block_type=["linear_attention", "full_attention", "mlp", "linear_attention", "moe",
                                "linear_attention"],
             mamba_num_heads=8, mamba_head_dim=8, n_groups=2, ssm_state_size=16, conv_kernel=4, chunk_size=4,
             n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
             moe_shared_expert_intermediate_size=48, routed_scaling_factor=2.5, n_group=1, topk_group=1,
             norm_topk_prob=True),
    ),
}
# GLM-4.5 with top-1 routing, its one sigmoid score kept (norm_topk_prob=false), as megatron keeps it
TINY["glm4_moe_top1"] = ("Glm4MoeConfig", {**TINY["glm4_moe"][1], "num_experts_per_tok": 1, "norm_topk_prob": False})
MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe_dense0", "glm4_moe", "deepseek_v3")


def make_tiny_hf(name: str, out_dir: str, *, vocab_size: int = 96, num_layers: int = 4, seed: int = 0) -> str:
    """Save a randomly initialised tiny model ``name`` (see TINY) to ``out_dir``; return it."""
    cls_name, extra = TINY[name]
    sizes = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        dtype="float32",
    )
    config = getattr(transformers, cls_name)(**{**sizes, **extra})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Random (not default-init) norms and biases so a wrong mapping cannot hide.
    with torch.no_grad():
        for pname, param in model.named_parameters():
            if pname.endswith("norm.weight") or pname.endswith("layernorm.weight"):
                param.uniform_(0.5, 1.5)
            elif pname.endswith("bias"):  # GPT-OSS's stacked expert biases: gate_up_proj_bias, down_proj_bias
                param.normal_(0, 0.1)
            elif pname.endswith("sinks"):
                param.normal_(0, 1.0)
            elif pname.endswith("mixer.D"):  # Mamba's skip weight per head
                param.normal_(1.0, 0.5)
        for bname, buf in model.named_buffers():  # GLM-4.5's router bias (a buffer)
            if bname.endswith("e_score_correction_bias"):
                buf.normal_(0, 0.1)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def padded_batch(vocab_size: int, seed: int = 1):
    """A left- and right-padded batch: input_ids, attention_mask, position_ids ``[4, 12]``."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab_size, (4, 12), generator=gen)
    attention_mask = torch.ones(4, 12, dtype=torch.long)
    attention_mask[0, :4] = 0   # left padding (prompt)
    attention_mask[1, 9:] = 0   # right padding (response)
    attention_mask[2, :2] = 0
    attention_mask[2, 10:] = 0
    input_ids = input_ids.masked_fill(attention_mask == 0, 0)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


def front_aligned(batch):
    """``batch`` (input_ids, attention_mask, position_ids) with each row's tokens moved to its front: the padding
    after them, as megarl's workers lay rows out for layers that take no padding mask (gated DeltaNet)."""
    input_ids, attention_mask, _ = batch
    order = torch.argsort(1 - attention_mask, dim=1, stable=True)
    mask = attention_mask.gather(1, order)
    return input_ids.gather(1, order) * mask, mask, (mask.cumsum(-1) - 1).clamp(min=0)


# The functions of HF's modeling modules that transformers' use_kernel_func_from_hub_with_fallback binds to another
# package's kernels (fla, causal-conv1d, mamba-ssm) at import, where that package is importable (transformers 5.19)
HF_KERNEL_FALLBACKS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
                       "causal_conv1d_update", "chunk_kimi_delta_attention", "recurrent_kimi_delta_attention",
                       "mamba2_chunk_scan", "mamba2_selective_state_update", "mamba2_split_conv1d_scan_combined",
                       "mamba_inner_fn", "mamba_selective_scan", "mamba_selective_state_update")


@contextlib.contextmanager
def hf_torch_path(hf_dir: str) -> Iterator[None]:
    """HF's own PyTorch functions in ``hf_dir``'s modeling module while it lasts: where transformers bound another
    package's kernel in their place (the decorator keeps the PyTorch function as ``__wrapped__``), the reference
    would run the kernels under test, and on CPU tensors, which Triton refuses (fla on 2 x H200, 2026-11-27)."""
    config = transformers.AutoConfig.from_pretrained(hf_dir)
    module = sys.modules[transformers.AutoModelForCausalLM._model_mapping[type(config)].__module__]
    bound = {name: getattr(module, name) for name in HF_KERNEL_FALLBACKS if hasattr(module, name)}
    try:
        for name, function in bound.items():
            torch_function = inspect.unwrap(function)
            assert torch_function.__module__ == module.__name__, (name, torch_function.__module__)
            setattr(module, name, torch_function)
        yield
    finally:
        for name, function in bound.items():
            setattr(module, name, function)


def hf_reference_model(hf_dir: str, device: str = "cpu"):
    """HF's model of ``hf_dir``, fp32, eager attention, in eval mode on ``device``, computing what its config says:
    transformers 5.17.0 (the GPU stack's, requirements/gpu-lock.txt) fixes GptOssExperts' ``alpha`` at 1.702 and
    ``limit`` at 7.0 whatever ``swiglu_alpha`` / ``swiglu_limit`` hold (5.19 reads them), and the tiny GPT-OSS'
    limit of 0.1, there so that the clamp engages, was ignored on the GPU (max |d| 0.0288 per layer, H200,
    2026-11-28)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        hf_dir, dtype=torch.float32, attn_implementation="eager").eval().to(device)
    config = model.config
    if config.model_type == "gpt_oss":  # 5.17's GptOssConfig declares neither field: GPT-OSS' own values then
        for layer in model.model.layers:
            layer.mlp.experts.limit = float(getattr(config, "swiglu_limit", 7.0))
            layer.mlp.experts.alpha = float(getattr(config, "swiglu_alpha", 1.702))
    return model


def hf_token_log_probs(hf_dir: str, input_ids, attention_mask, position_ids, *, device: str = "cpu",
                       hf_kernels: bool = False) -> torch.Tensor:
    """HF transformers reference: log p(token t+1 | <= t), ``[b, s-1]`` on the CPU, fp32 eager, run on ``device``
    with HF's PyTorch functions, or with the kernels transformers binds in their place (``hf_kernels``: fla,
    causal-conv1d, mamba-ssm where installed; CUDA only)."""
    with contextlib.nullcontext() if hf_kernels else hf_torch_path(hf_dir):
        model = hf_reference_model(hf_dir, device)
        with torch.no_grad():
            logits = model(
                input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                position_ids=position_ids.to(device)
            ).logits
    log_probs = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, input_ids[:, 1:, None].to(device))[..., 0]
    return log_probs.cpu()


def assert_matches_hf(hf_dir: str, batch, per_rank: list[dict], packed: bool) -> None:
    """Every rank's log-probs (``mcore_body.convert_and_forward`` results; the thd-packed ones too when
    ``packed``) equal HF transformers' on the valid tokens (atol 1e-5), and every rank's export equals the
    safetensors bitwise, names included."""
    input_ids, attention_mask, position_ids = batch
    expected = hf_token_log_probs(hf_dir, input_ids, attention_mask, position_ids)
    # Next-token log-probs where both the token and its context position are real.
    valid = (attention_mask[:, :-1] * attention_mask[:, 1:]).bool()
    results = [r["result"] for r in per_rank if r["result"] is not None]
    packed_results = [r["packed"] for r in per_rank if r["packed"] is not None]
    assert len(packed_results) == (len(per_rank) if packed else 0)
    results += packed_results
    assert results, "no rank returned log-probs"
    for got in results:
        assert got.shape == expected.shape
        torch.testing.assert_close(got[valid], expected[valid], atol=1e-5, rtol=1e-5)

    saved = load_file(f"{hf_dir}/model.safetensors")
    for rank_result in per_rank:
        exported = rank_result["export"]
        assert list(exported) == list(dict.fromkeys(exported))  # no duplicates
        assert set(exported) == set(saved)
        for name, tensor in saved.items():
            assert torch.equal(exported[name], tensor), name


# model_type -> (MoE block name in the checkpoint, expert gate / up / down projection names)
_CHECKPOINT_EXPERTS = {"mixtral": ("block_sparse_moe", "w1", "w3", "w2")}
_QWEN_EXPERTS = ("mlp", "gate_proj", "up_proj", "down_proj")
# model_type -> (in-memory name part, checkpoint name part): transformers' conversion_mapping.py renames on load
_CHECKPOINT_RENAMES = {"hy_v3": ((".mlp.gate.", ".mlp.router.gate."), (".mlp.shared_experts.", ".mlp.shared_mlp."))}


def checkpoint_named_grads(model) -> dict[str, torch.Tensor]:
    """``.grad`` of every parameter under its checkpoint name. transformers 5 keeps MoE experts
    fused in memory (``mlp.experts.gate_up_proj`` ``[E, 2I, H]``, ``down_proj`` ``[E, H, I]``) and
    saves them per expert (Mixtral under ``block_sparse_moe`` as w1 / w3 / w2): split them so; Hy3's router and
    shared experts are renamed back to its checkpoint's names."""
    if model.config.model_type == "nemotron_h":
        return _nemotron_h_checkpoint_grads(model)
    block, gate_name, up_name, down_name = _CHECKPOINT_EXPERTS.get(model.config.model_type, _QWEN_EXPERTS)
    grads = {}
    for name, param in model.named_parameters():
        if name.endswith("mlp.experts.down_proj"):
            continue
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix = name[: -len("mlp.experts.gate_up_proj")]
            down = dict(model.named_parameters())[prefix + "mlp.experts.down_proj"].grad
            for e in range(param.grad.shape[0]):
                gate, up = param.grad[e].chunk(2)
                expert = f"{prefix}{block}.experts.{e}."
                grads.update({expert + f"{gate_name}.weight": gate, expert + f"{up_name}.weight": up,
                              expert + f"{down_name}.weight": down[e]})
        elif name.endswith("mlp.gate.weight") and block != "mlp":
            grads[name.replace(".mlp.gate.", f".{block}.gate.")] = param.grad
        else:
            for memory, checkpoint in _CHECKPOINT_RENAMES.get(model.config.model_type, ()):
                name = name.replace(memory, checkpoint)
            grads[name] = param.grad
    return grads


def _nemotron_h_checkpoint_grads(model) -> dict[str, torch.Tensor]:
    """Nemotron-H's ``.grad`` under its checkpoint names: ``backbone.`` for ``model.``, its non-gated experts
    (``mixer.experts.up_proj`` ``[E, I, H]``, ``down_proj`` ``[E, H, I]`` in memory) one tensor per expert."""
    grads = {}
    for name, param in model.named_parameters():
        name = "backbone." + name.removeprefix("model.") if name.startswith("model.") else name
        if name.endswith(("mixer.experts.up_proj", "mixer.experts.down_proj")):
            prefix, proj = name.rsplit(".", 1)
            grads.update({f"{prefix}.{e}.{proj}.weight": grad for e, grad in enumerate(param.grad)})
        else:
            grads[name] = param.grad
    return grads
