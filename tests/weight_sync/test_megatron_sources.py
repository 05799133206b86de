"""Megatron TP=1 / TP=2 / PP=2 (Qwen2) sources -> weight-sync transport -> vLLM.

1. The tensors the transport hands to vLLM equal the HF export of the same Megatron
   weights BITWISE. Reference: the HF checkpoint with the same elementwise change
   the Megatron weights got after loading (``p * scale + shift``, one (scale, shift)
   per layout, so a no-op sync would fail).
2. A vLLM TP=1 engine synced with those tensors generates greedy tokens and
   log-probs identical to an engine loaded from that export on disk (the first
   layout: a fresh engine started from it; later layouts: the same engine reloaded
   from disk through vLLM's own loader). Each layout changes the weights, so a sync
   that did nothing would leave the previous layout's outputs and fail.
"""

from __future__ import annotations

import pytest
import torch

from engine_compare import greedy, make_worker, run_layout, write_expected
from helpers.tiny_hf import build_tiny_qwen2

pytestmark = pytest.mark.slow

LAYOUTS = {  # id: (world, megatron cfg, scale, shift, transport)
    "tp1": (1, {}, 1.01, 0.001, "in_process"),
    "tp2": (2, {"tensor_model_parallel_size": 2}, 0.99, -0.002, "in_process"),
    "pp2": (2, {"pipeline_model_parallel_size": 2}, 1.03, 0.0005, "in_process"),
    "tp2_broadcast": (2, {"tensor_model_parallel_size": 2}, 0.97, 0.003, "broadcast"),
}


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return build_tiny_qwen2(tmp_path_factory.mktemp("src_qwen2"))


@pytest.fixture(scope="module")
def layout_results(hf_dir):
    cache = {}

    def get(layout):
        if layout not in cache:
            world, cfg, scale, shift, transport = LAYOUTS[layout]
            cache[layout] = run_layout(hf_dir, world, cfg, scale, shift, transport)
        return cache[layout]

    return get


@pytest.fixture(scope="module")
def engines(hf_dir, tmp_path_factory):
    """(synced engine started with dummy weights, reference engine started from the
    first layout's expected export)."""
    first = write_expected(hf_dir, tmp_path_factory.mktemp("expected_tp1"), *LAYOUTS["tp1"][2:4])
    synced, reference = make_worker(hf_dir, "dummy"), make_worker(first, "auto")
    yield synced, reference
    synced.shutdown()
    reference.shutdown()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_transport_hands_vllm_the_exact_hf_export(layout, layout_results):
    for rank, res in enumerate(layout_results(layout)):
        assert res["unequal"] == [], f"rank {rank}: tensors differ from the HF export: {res['unequal']}"
        assert res["extra"] == []
        assert res["order_matches_plan"]
        assert res["metrics"]["weight_sync/buckets"] > 1
        assert res["metrics"]["weight_sync/peak_extra_bytes"] <= 2 * res["max_bucket_bytes"]


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_synced_engine_matches_engine_loaded_from_export(layout, layout_results, engines, hf_dir, tmp_path):
    synced, reference = engines
    captured = layout_results(layout)[0]["captured"]
    synced.update_weights(iter(captured.items()))
    tokens, log_probs = greedy(synced)
    if layout != "tp1":
        expected_dir = write_expected(hf_dir, tmp_path / "expected", *LAYOUTS[layout][2:4])
        reference.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(expected_dir)})
        reference.llm.reset_prefix_cache()
    ref_tokens, ref_log_probs = greedy(reference)
    assert torch.equal(tokens, ref_tokens)
    assert torch.equal(log_probs, ref_log_probs)
