"""MoE families on one GPU with the transformer-engine spec: grouped GEMM experts (TEGroupedMLP),
log-probs of packed (thd) rows equal HF transformers' fp32 forward, export bitwise.

(TE's spec ignores a padding mask, so only the packed forward is compared; see
``megarl.models`` and tests/gpu/test_te_spec.py.) DeepSeek-V3 is left out: multi-latent attention
runs on the local spec only (``megarl.models.mla_config``). Skipped without CUDA or transformer-engine.
"""

from __future__ import annotations

import pytest
import torch
from helpers.dist_utils import run_distributed
from hf_tiny import MOE_FAMILIES, hf_token_log_probs, make_tiny_hf, padded_batch
from mcore_body import convert_and_forward
from safetensors.torch import load_file

TE_MOE_FAMILIES = tuple(name for name in MOE_FAMILIES if name != "deepseek_v3")


@pytest.mark.gpu
@pytest.mark.slow
def test_grouped_gemm_moe_matches_hf(tmp_path):
    pytest.importorskip("transformer_engine")
    cases = [{"hf_dir": make_tiny_hf(name, str(tmp_path / name), num_layers=2), "batch": padded_batch(96),
              "packed": True} for name in TE_MOE_FAMILIES]
    results = run_distributed(convert_and_forward, 1, {}, cases, "cuda", timeout=300)[0]
    for name, case, res in zip(TE_MOE_FAMILIES, cases, results):
        assert res["experts"] == ["TEGroupedMLP"], (name, res["experts"])
        input_ids, attention_mask, position_ids = case["batch"]
        expected = hf_token_log_probs(case["hf_dir"], input_ids, attention_mask, position_ids)
        valid = (attention_mask[:, :-1] * attention_mask[:, 1:]).bool()
        worst = (res["packed"][valid] - expected[valid]).abs().max().item()
        print(f"{name}: grouped-GEMM packed |logp - HF| max {worst:.2e}")
        torch.testing.assert_close(res["packed"][valid], expected[valid], atol=2e-4, rtol=1e-4)
        saved = load_file(f"{case['hf_dir']}/model.safetensors")
        assert set(res["export"]) == set(saved)
        for tensor_name, tensor in saved.items():
            assert torch.equal(res["export"][tensor_name], tensor), (name, tensor_name)
