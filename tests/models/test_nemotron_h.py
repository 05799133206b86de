"""NVIDIA Nemotron-H (``nemotron_h``: Mamba-2, attention, squared-ReLU MLP and MoE layers, one kind per layer)
built in megatron-core from its HF config, against HF transformers.

Log-probs equal HF's eager fp32 forward (atol 1e-5) on a batch whose rows have their padding after their tokens
(megatron's MambaMixer takes no padding mask; megarl's workers lay rows out so), through megatron's pipeline schedule
and packed as thd sequences (the Mamba kernels split at each sequence's start), at TP=1, TP=2 (Mamba heads and
groups, convolution channels, attention heads, MLP, shared and routed experts split) and TP=2 with sequence
parallelism; EP=2 and PP=2 with ``-m extended``; with gradients equal to HF
autograd's at TP=1 (through megarl's torch Mamba kernels: every Mamba parameter included); the HF -> megatron -> HF
export is bitwise the safetensors (checkpoint names under ``backbone.``) on every rank. On CPU the Mamba kernels
are megarl's torch ones (megarl.compat.megatron_core.mamba_torch).

megarl's TransformerConfig has the fields Megatron-Bridge 0.6.2's Nemotron-H provider sets that decide the model, read
from NVIDIA-Nemotron-3-Nano-30B-A3B's own config.json, and the same layer pattern. Where they differ by design: the
bridge trains the router's expert bias (``moe_router_bias_update_rate`` 0.001) with a sequence aux loss (1e-4);
megarl keeps the bias frozen and no aux loss, as HF and vLLM never change it (megarl.models.moe_config).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.dist_utils import run_distributed
from hf_tiny import assert_matches_hf, front_aligned, hf_token_log_probs, make_tiny_hf, padded_batch
from mcore_body import convert_and_forward
from test_megatron_vs_hf import _check_grads

NANO = Path(__file__).parents[1] / "fixtures" / "verl_scripts" / "models" / "Nemotron-3-Nano-30B-A3B"
LAYOUTS = {
    "tp1": (1, {}),
    "tp2": (2, {"tensor_model_parallel_size": 2}),
    # sequence parallel: the Mamba in_proj gathers the sequence, out_proj scatters it (padded rows only: the packed
    # batch's 37 tokens do not split over 2 ranks)
    "tp2_sp": (2, {"tensor_model_parallel_size": 2, "sequence_parallel": True}),
    "ep2": (2, {"expert_model_parallel_size": 2}),
    "pp2": (2, {"pipeline_model_parallel_size": 2}),  # M * - | M E M: each stage's layers by its offset
}
EXTENDED = ("ep2", "pp2")


@pytest.fixture(scope="module")
def nemotron_h_dir(tmp_path_factory):
    return make_tiny_hf("nemotron_h", str(tmp_path_factory.mktemp("nemotron_h")), num_layers=6)


@pytest.mark.slow
@pytest.mark.parametrize("layout", [pytest.param(name, marks=pytest.mark.extended) if name in EXTENDED else name
                                    for name in LAYOUTS])
def test_logprobs_and_roundtrip(layout, nemotron_h_dir):
    world, megatron_cfg = LAYOUTS[layout]
    packed = layout not in ("tp2_sp", "pp2")  # thd packing where the model is one chunk and the tokens split
    case = {"hf_dir": nemotron_h_dir, "batch": front_aligned(padded_batch(96)), "packed": packed, "grad": layout == "tp1"}
    per_rank = run_distributed(convert_and_forward, world, megatron_cfg, [case], timeout=240)
    assert_matches_hf(nemotron_h_dir, case["batch"], [r[0] for r in per_rank], packed=packed)
    if case["grad"]:
        # the export names the router's expert bias too: a buffer (state, not trained) that HF gives no gradient
        _check_grads(nemotron_h_dir, case["batch"], [{k: g for k, g in r[0]["grads"].items() if not k.endswith("e_score_correction_bias")}
                                                     for r in per_rank])



@pytest.mark.gpu
def test_mamba_ssm_kernels_match_hf(nemotron_h_dir):
    """One GPU with mamba-ssm and causal-conv1d: their kernels in the same local-spec model, against HF's fp32
    forward within tests/models/test_gpu_moe.py's tolerance (the Triton scan accumulates in another order)."""
    import torch

    pytest.importorskip("mamba_ssm")
    pytest.importorskip("causal_conv1d")
    batch = front_aligned(padded_batch(96))
    res = run_distributed(convert_and_forward, 1, {}, [{"hf_dir": nemotron_h_dir, "batch": batch, "packed": True}],
                          "cuda", timeout=300)[0][0]
    expected = hf_token_log_probs(nemotron_h_dir, *batch)
    valid = (batch[1][:, :-1] * batch[1][:, 1:]).bool()
    for got in (res["result"], res["packed"]):
        torch.testing.assert_close(got[valid], expected[valid], atol=2e-4, rtol=1e-4)


def config_vs_bridge(model_dir: str) -> dict:
    """One rank: megarl's TransformerConfig of ``model_dir`` and Megatron-Bridge's Nemotron-H provider of the same
    config.json, on the fields that decide the model, and each one's layer pattern."""
    import torch
    import transformers

    from megarl.compat.megatron_bridge import auto_bridge
    from megarl.config.rules.model import NEMOTRON_H_PATTERN
    from megarl.models.config import gpt_model_kwargs, hf_to_transformer_config
    from megarl.models.nemotron_h import nemotron_h_layer_kinds
    from megarl.parallel import init_distributed

    init_distributed({}, "cpu", seed=0)
    hf_config = transformers.AutoConfig.from_pretrained(model_dir)
    ours = hf_to_transformer_config(hf_config, {}, device="cpu", dtype=torch.float32)
    theirs = auto_bridge().from_hf_pretrained(model_dir).to_megatron_provider(load_weights=False)
    symbol = {kind: char for char, kind in NEMOTRON_H_PATTERN.items()}
    y = torch.linspace(-4, 4, 33)
    out = {}
    for name, config in (("megarl", ours), ("bridge", theirs)):
        out[name] = {
            "activation": config.activation_func(y),
            "moe_router_num_groups": config.moe_router_num_groups or 1,
            **{field: getattr(config, field) for field in (
                "gated_linear_unit", "add_bias_linear", "add_qkv_bias", "qk_layernorm", "normalization",
                "layernorm_epsilon", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                "num_query_groups", "kv_channels", "mamba_state_dim", "mamba_head_dim", "mamba_num_groups",
                "mamba_num_heads", "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size",
                "moe_shared_expert_intermediate_size", "moe_router_score_function", "moe_router_pre_softmax",
                "moe_router_enable_expert_bias", "moe_router_topk_scaling_factor", "moe_router_dtype")},
        }
    model = gpt_model_kwargs(hf_config)
    out["megarl"].update(pattern="".join(symbol[k] for k in nemotron_h_layer_kinds(hf_config)),
                         moe_layers=[i for i, moe in enumerate(ours.moe_layer_freq) if moe],
                         position_embedding_type=model["position_embedding_type"],
                         tied=model["share_embeddings_and_output_weights"])
    out["bridge"].update(pattern=theirs.hybrid_layer_pattern,
                         moe_layers=[i for i, c in enumerate(theirs.hybrid_layer_pattern) if c == "E"],
                         position_embedding_type=theirs.position_embedding_type,
                         tied=theirs.share_embeddings_and_output_weights)
    return out


@pytest.mark.slow
def test_config_equals_megatron_bridge_provider():
    import torch

    got = run_distributed(config_vs_bridge, 1, str(NANO), timeout=300)[0]
    ours, theirs = got["megarl"], got["bridge"]
    torch.testing.assert_close(ours.pop("activation"), theirs.pop("activation"))
    assert ours == theirs
    assert ours["pattern"].count("M") == 23 and ours["pattern"].count("*") == 6 and len(ours["moe_layers"]) == 23
