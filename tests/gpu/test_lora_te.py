"""LoRA on transformer-engine's layers (megarl/models/lora.py), fp32 with TF32 off, dense Qwen2 (TE's fused
layernorm + linear, whose adapter recomputes the norm) and Qwen3-MoE (experts as an MLP each, TE's linears),
the adapters' B set nonzero (seeded by the adapter's name):

* within each spec, the adapted forward equals the spec's own forward of the merged weights W + scale * B @ A
  (the reference that needs no second implementation), and the adapters move the log-probs far beyond that;
* against LoRA on megatron's own linears (the local spec, checked against HF and a merge by hand in
  tests/workers/test_lora.py): the adapted models differ by no more than the two specs' base models do in the
  same run (TE's fp32 kernels are not the local spec's: measured 2026-11-28 on an H200, |TE - local| up to
  9e-4 dense and 0.028 MoE with the adapters on), and the adapters' gradients agree.

One GPU; skipped without CUDA (root conftest) or transformer-engine."""

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

    def diff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a - b)[mask].abs()

    for impl, r in runs.items():
        lora_vs_merged = diff(r["lora"], r["merged"])
        # MoE: a rounding difference may move a near-tied token to another expert (a few tokens; a wrong adapter
        # moves them all); dense: every token
        worst = lora_vs_merged.quantile(0.9) if family == "qwen3_moe" else lora_vs_merged.max()
        assert worst < 1e-4, (impl, float(lora_vs_merged.max()))
        assert diff(r["lora"], r["base"]).mean() > 1e-2, impl  # the adapters matter: not vacuous
    # TE's kernels move MoE tokens across near-tied routes, with or without adapters: their count varies, hence 3x;
    # a wrong adapter would differ by its effect, ~0.4-1.6 here, 100x more
    spec_gap = diff(te["base"], local["base"]).mean()
    assert diff(te["lora"], local["lora"]).mean() <= 3 * spec_gap + 1e-5, spec_gap
    assert te["grads"].keys() == local["grads"].keys()
    te_grads, local_grads = (torch.cat([g[n].flatten() for n in sorted(g)]) for g in (te["grads"], local["grads"]))
    assert (te_grads - local_grads).norm() / local_grads.norm() < 0.05
    assert any(g.abs().max() > 0 for n, g in local["grads"].items() if n.endswith(".A"))  # not vacuous
