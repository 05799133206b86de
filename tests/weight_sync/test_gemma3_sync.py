"""Gemma 3 text: megatron (TP=1) source -> transport -> vLLM, as test_moe_sources.py does per MoE family.

The tensors handed to vLLM equal the HF export of the perturbed weights bitwise, and a synced
vLLM engine (started with dummy weights) generates exactly what an engine started from that export
generates; prompt + response are longer than the sliding window. Gemma 3 ties its LM head as a
separate vLLM module: the synced engine's logits come from it
(``megarl.compat.vllm.cpu_repack.reprepack_cpu_tied_lm_head``). Two vLLM engines: ``-m extended``.
"""

from __future__ import annotations

import pytest

from engine_compare import assert_synced_engine_matches_export, run_layout, write_expected
from helpers.tiny_hf import build_tiny_gemma3

pytestmark = [pytest.mark.slow, pytest.mark.extended]

SCALE, SHIFT = 1.01, -0.001


def test_gemma3_synced_engine_matches_engine_loaded_from_export(tmp_path):
    src = build_tiny_gemma3(tmp_path / "src")
    results = run_layout(src, 1, {}, SCALE, SHIFT)
    assert results[0]["unequal"] == [] and results[0]["extra"] == [] and results[0]["order_matches_plan"]
    expected_dir = write_expected(src, tmp_path / "expected", SCALE, SHIFT)
    assert_synced_engine_matches_export(src, results[0]["captured"], expected_dir)
