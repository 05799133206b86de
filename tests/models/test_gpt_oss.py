"""GPT-OSS (attention sinks, sliding-window layers, YaRN, MoE with biases and experts stacked per layer) built
in megatron-core from its HF config, against HF transformers and Megatron-Bridge.

* log-probs equal HF's eager fp32 forward (atol 1e-5) on a left/right padded batch, through megatron's
  pipeline schedule and packed as thd sequences, at TP=1, TP=2 (sinks and attention split; expert TP 1, as
  Megatron-Core requires for biased experts) and EP=2 (each rank two of the four experts), PP=2 with
  ``-m extended``; the HF -> megatron -> HF export is bitwise the safetensors on every rank;
* megarl's TransformerConfig has the fields Megatron-Bridge 0.6.2's GPT-OSS provider sets, read from
  gpt-oss-20b's own config.json;
* the bridge's own GPT-OSS mapping loads the same tensors into megarl's model as megarl's converters do
  (bitwise), and exports them back to the checkpoint: an independent check of the stacked-expert layouts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.dist_utils import run_distributed
from hf_tiny import assert_matches_hf, make_tiny_hf, padded_batch
from mcore_body import convert_and_forward

pytestmark = pytest.mark.slow

LAYOUTS = {
    "tp1": (1, {}),
    "tp2": (2, {"tensor_model_parallel_size": 2, "expert_tensor_parallel_size": 1}),
    "ep2": (2, {"expert_model_parallel_size": 2}),
    "pp2": (2, {"pipeline_model_parallel_size": 2}),  # each stage's stacked experts broadcast to the other
}
EXTENDED = ("pp2",)
GPT_OSS_20B = Path(__file__).parents[1] / "fixtures" / "verl_scripts" / "models" / "gpt-oss-20b"


@pytest.fixture(scope="module")
def gpt_oss_dir(tmp_path_factory):
    return make_tiny_hf("gpt_oss", str(tmp_path_factory.mktemp("gpt_oss")), num_layers=2)


@pytest.mark.parametrize("layout", [pytest.param(name, marks=pytest.mark.extended) if name in EXTENDED else name
                                    for name in LAYOUTS])
def test_logprobs_and_roundtrip(layout, gpt_oss_dir):
    world, megatron_cfg = LAYOUTS[layout]
    packed = layout not in EXTENDED  # thd packing where the model is one chunk
    case = {"hf_dir": gpt_oss_dir, "batch": padded_batch(96), "packed": packed}
    per_rank = run_distributed(convert_and_forward, world, megatron_cfg, [case], timeout=240)
    assert_matches_hf(gpt_oss_dir, case["batch"], [r[0] for r in per_rank], packed=packed)


def config_vs_bridge(model_dir: str) -> dict:
    """One rank: megarl's TransformerConfig and GPTModel rotary of ``model_dir``, and Megatron-Bridge's GPT-OSS
    provider of the same config.json, on the fields that decide the model."""
    import torch
    import transformers

    from megarl.compat.megatron_bridge import auto_bridge
    from megarl.models.config import gpt_model_kwargs, hf_to_transformer_config
    from megarl.parallel import init_distributed

    init_distributed({}, "cpu", seed=0)
    hf_config = transformers.AutoConfig.from_pretrained(model_dir)
    ours = hf_to_transformer_config(hf_config, {}, device="cpu", dtype=torch.float32)
    rotary = gpt_model_kwargs(hf_config)
    theirs = auto_bridge().from_hf_pretrained(model_dir).to_megatron_provider(load_weights=False)
    from megatron.core.transformer.utils import is_layer_window_attention

    y = torch.linspace(-12, 12, 97)
    out = {}
    for name, config in (("megarl", ours), ("bridge", theirs)):
        out[name] = {
            "window": [is_layer_window_attention(config.window_size, config.window_attn_skip_freq, n) and config.window_size
                       for n in range(1, config.num_layers + 1)],
            "qkv_bias": config.add_bias_linear or config.add_qkv_bias,
            "activation": config.activation_func(y),
            **{field: getattr(config, field) for field in (
                "softmax_type", "add_bias_linear", "activation_func_clamp_value", "glu_linear_offset", "gated_linear_unit",
                "normalization", "layernorm_epsilon", "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size",
                "moe_router_pre_softmax", "moe_router_score_function", "moe_router_load_balancing_type", "kv_channels",
                "num_query_groups", "num_attention_heads", "hidden_size", "num_layers", "yarn_rotary_scaling_factor",
                "yarn_original_max_position_embeddings", "yarn_beta_fast", "yarn_beta_slow", "yarn_mscale",
                "yarn_mscale_all_dim", "yarn_correction_range_round_to_int")},
        }
    out["megarl"].update(position_embedding_type=rotary["position_embedding_type"], rotary_base=rotary["rotary_base"],
                         tied=rotary["share_embeddings_and_output_weights"])
    out["bridge"].update(position_embedding_type=theirs.position_embedding_type, rotary_base=float(theirs.rotary_base),
                         tied=theirs.share_embeddings_and_output_weights)
    return out


def test_config_equals_megatron_bridge_provider():
    import torch

    got = run_distributed(config_vs_bridge, 1, str(GPT_OSS_20B), timeout=300)[0]
    ours, theirs = got["megarl"], got["bridge"]
    torch.testing.assert_close(ours.pop("activation"), theirs.pop("activation"))
    assert ours == theirs
    assert ours["window"][:2] == [(127, 0), False] and ours["softmax_type"] == "learnable"


def test_megatron_fused_clamped_geglu_clamps_before_the_bias():
    """Why SequentialMLP experts run GPT-OSS's activation unfused on CUDA (megarl.compat.megatron_core.clamped_geglu):
    megatron-core's fused bias + clamped quick-GEGLU clamps its input and then adds the bias, where HF clamps
    gate_up + bias.
    When this fails megatron has changed the kernel: bias_activation_fusion can follow grouped_gemm no more."""
    import torch
    from megatron.core.fusions.fused_bias_geglu import weighted_bias_quick_geglu_impl

    gen = torch.Generator().manual_seed(0)
    x, bias, probs = torch.randn(5, 8, generator=gen) * 6, torch.randn(8, generator=gen) * 3, torch.rand(5, 1, generator=gen)

    def act(y):  # quick-GELU GLU with the + 1 offset, weighted per token
        gate, up = y.chunk(2, -1)
        return gate * torch.sigmoid(1.702 * gate) * (up + 1) * probs

    def clamp(y):  # gate halves at most 7, up halves within +-7
        gate, up = y.chunk(2, -1)
        return torch.cat([gate.clamp(max=7.0), up.clamp(-7.0, 7.0)], -1)

    fused = weighted_bias_quick_geglu_impl(x, bias, probs, False, 1.0, 7.0)
    assert (fused - act(clamp(x + bias))).abs().max() > 1.0  # not HF's (GptOssExperts: clamp(gate_up + bias))
    torch.testing.assert_close(fused, act(clamp(x) + bias))


@pytest.mark.gpu
@pytest.mark.parametrize("grouped", [True, False], ids=["grouped_experts", "sequential_experts"])
def test_transformer_engine_spec_matches_hf(gpt_oss_dir, grouped):
    """One GPU with transformer-engine (its attention with learnable softmax offsets, experts with biases,
    grouped: TEGroupedMLP, or one MLP each: SequentialMLP, which takes the activation unfused): packed rows
    (TE's spec takes no padding mask) against HF's fp32 forward within tests/models/test_gpu_moe.py's
    tolerance, export bitwise."""
    import torch
    from hf_tiny import hf_token_log_probs
    from safetensors.torch import load_file

    pytest.importorskip("transformer_engine")
    case = {"hf_dir": gpt_oss_dir, "batch": padded_batch(96), "packed": True}
    cfg = {} if grouped else {"override_transformer_config": {"moe_grouped_gemm": False}}
    res = run_distributed(convert_and_forward, 1, cfg, [case], "cuda", timeout=300)[0][0]
    assert res["experts"] == ["TEGroupedMLP" if grouped else "SequentialMLP"]
    input_ids, attention_mask, position_ids = case["batch"]
    expected = hf_token_log_probs(gpt_oss_dir, input_ids, attention_mask, position_ids)
    valid = (attention_mask[:, :-1] * attention_mask[:, 1:]).bool()
    torch.testing.assert_close(res["packed"][valid], expected[valid], atol=2e-4, rtol=1e-4)
    saved = load_file(f"{gpt_oss_dir}/model.safetensors")
    assert set(res["export"]) == set(saved) and all(torch.equal(res["export"][k], v) for k, v in saved.items())
