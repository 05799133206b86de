"""Tencent Hy3 (``hy_v3``: QK-norm GQA, a dense first layer, sigmoid-routed experts with a score-correction bias
and scaling, a shared expert) built in megatron-core from its HF config, against HF transformers.

* log-probs equal HF's eager fp32 forward (atol 1e-5) on a left/right padded batch, through megatron's pipeline
  schedule and packed as thd sequences, at TP=1 (with gradients against HF autograd, router and expert bias
  included) and TP=2 (attention, dense MLP, shared and routed experts split); EP=2 (each rank two of the four
  experts) and PP=2 (the dense layer on stage 0, the MoE layer on stage 1) with ``-m extended``; the
  HF -> megatron -> HF export is bitwise the safetensors (Hy3's checkpoint names) on every rank;
* config.json fields HF and vLLM read differently are refused, naming the field.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from helpers.dist_utils import run_distributed
from hf_tiny import TINY, assert_matches_hf, make_tiny_hf, padded_batch
from mcore_body import convert_and_forward
from test_megatron_vs_hf import _check_grads

from megarl.models.config import hf_to_transformer_config

LAYOUTS = {
    "tp1": (1, {}),
    "tp2": (2, {"tensor_model_parallel_size": 2}),
    "ep2": (2, {"expert_model_parallel_size": 2}),
    "pp2": (2, {"pipeline_model_parallel_size": 2}),
}
EXTENDED = ("ep2", "pp2")


@pytest.fixture(scope="module")
def hy_v3_dir(tmp_path_factory):
    return make_tiny_hf("hy_v3", str(tmp_path_factory.mktemp("hy_v3")), num_layers=2)


@pytest.mark.slow
@pytest.mark.parametrize("layout", [pytest.param(name, marks=pytest.mark.extended) if name in EXTENDED else name
                                    for name in LAYOUTS])
def test_logprobs_and_roundtrip(layout, hy_v3_dir):
    world, megatron_cfg = LAYOUTS[layout]
    packed = layout != "pp2"  # thd packing where the model is one chunk
    case = {"hf_dir": hy_v3_dir, "batch": padded_batch(96), "packed": packed, "grad": layout == "tp1"}
    per_rank = run_distributed(convert_and_forward, world, megatron_cfg, [case], timeout=240)
    assert_matches_hf(hy_v3_dir, case["batch"], [r[0] for r in per_rank], packed=packed)
    if case["grad"]:
        # the export names the expert bias too: a buffer (state, not trained) that HF gives no gradient
        _check_grads(hy_v3_dir, case["batch"], [{k: g for k, g in r[0]["grads"].items() if not k.endswith("expert_bias")}
                                                for r in per_rank])


def _config(**fields):
    return transformers.HYV3Config(**{**TINY["hy_v3"][1], "num_hidden_layers": 3, **fields})


def test_moe_fields_follow_the_hf_config():
    from megarl.models.moe_config import moe_transformer_kwargs

    kw = moe_transformer_kwargs(_config(num_shared_experts=2, output_router_logits=True), grouped_gemm=False,
                                on_cpu=True)
    assert kw["moe_layer_freq"] == [0, 1, 1] and kw["moe_router_score_function"] == "sigmoid"
    assert kw["moe_router_enable_expert_bias"] and kw["moe_router_bias_update_rate"] == 0.0
    assert kw["moe_router_topk_scaling_factor"] == 2.826 and kw["moe_router_num_groups"] is None
    assert kw["moe_shared_expert_intermediate_size"] == 64 and kw["moe_router_load_balancing_type"] == "none"
    from megarl.models.config import _qk_norm, _qkv_bias

    assert _qk_norm(_config()) and not _qkv_bias(_config())


@pytest.mark.parametrize("fields, match", [
    ({"route_norm": False}, "route_norm=false"),
    ({"qk_norm": False}, "qk_norm=true"),
    ({"first_k_dense_replace": 2}, "first_k_dense_replace=2"),
    ({"mlp_layer_types": ["dense", "dense", "sparse"]}, "first_k_dense_replace=1"),
    ({"mlp_layer_types": ["dense", "moe", "sparse"]}, "mlp_layer_types"),
    ({"expert_hidden_dim": 64}, "expert_hidden_dim=64"),
    ({"num_experts_per_tok": 1}, "num_experts_per_tok=1"),
    ({"num_shared_experts": 0}, "num_shared_experts=0"),
    ({"attention_bias": True}, "attention_bias=true"),
    ({"mlp_bias": True}, "mlp_bias=true"),
    ({"route_norm": None}, "lacks route_norm"),
])
def test_fields_hf_and_vllm_read_differently_are_refused(fields, match):
    with pytest.raises(ValueError, match=match):
        hf_to_transformer_config(_config(**fields), {}, device="cpu", dtype=torch.float32)
