"""LoRA on transformer-engine's layers (megarl/models/lora.py) against LoRA on megatron's own linears (the
local spec, itself checked against HF and a merge by hand in tests/workers/test_lora.py): the same base
weights and the same adapters (A seeded by the layer's name; B set nonzero, seeded by its name) give the
same log-probs and the same adapter gradients, fp32 with TF32 off. Dense Qwen2 (TE's fused layernorm +
linear, whose adapter recomputes the norm) and Qwen3-MoE (experts as an MLP each, TE's linears). One GPU;
skipped without CUDA (root conftest) or transformer-engine."""

from __future__ import annotations

import pytest
import torch

from helpers.dist_utils import run_distributed

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.mark.parametrize("family", ["qwen2", "qwen3_moe"])
def test_lora_on_te_layers_equals_lora_on_megatron_layers(family, tmp_path):
    pytest.importorskip("transformer_engine")
    from helpers.tiny_hf import build_tiny_qwen3_moe
    from te_bodies import VOCAB, grpo_batch, lora_te_vs_local, make_model

    model_dir = (make_model(str(tmp_path / family), family) if family == "qwen2"
                 else str(build_tiny_qwen3_moe(tmp_path / family, vocab=VOCAB)))
    batch = grpo_batch()
    runs = run_distributed(lora_te_vs_local, 1, model_dir, batch, timeout=600)[0]
    te, local = runs["transformer_engine"], runs["local"]
    assert (te["built"], local["built"]) == ("transformer_engine", "local")
    assert te["adapted"] == local["adapted"] and te["adapted"]
    assert te["fused_norm_adapted"]  # linear_qkv / linear_fc1 fused with their norm: the recomputed-norm path
    if family == "qwen3_moe":
        assert te["experts"] == ["SequentialMLP"] and any("local_experts" in n for n in te["adapted"])
    mask = batch["response_mask"].bool()
    assert (te["log_probs"] - local["log_probs"])[mask].abs().max() < 1e-4
    for name, grad in local["grads"].items():
        torch.testing.assert_close(te["grads"][name], grad, rtol=1e-3, atol=1e-6, msg=name)
    assert any(g.abs().max() > 0 for n, g in local["grads"].items() if n.endswith(".A"))  # not vacuous
