"""Actor steps with the transformer-engine layer spec on one GPU (issue 23).

With TE's spec, padded batches (left-padded prompts) gave wrong log-probs (TE ignores a
padding mask under megatron's `causal` mask type, so tokens attended to the padding) and a
GRPO step stopped with a NaN gradient. Checked here, padded and packed, TE and SDPA specs:

* the spec asked for (`override_transformer_config.transformer_impl`) is the one built;
* log-probs equal HF transformers' fp32 forward with its attention mask, within bf16
  tolerance, and are far from HF *without* the mask (so attending to padding fails this);
* every gradient after one update is finite, and TE's grad norm matches SDPA's;
* the TE model's parameters are exactly those the weight converter maps (fused norms);
* TE's fused RoPE and weight-gradient accumulation into main_grad are on by default and give the
  gradients of the unfused run (accumulated over two micro-batches, packed and padded).

Skipped without CUDA (root conftest) or without transformer-engine.
"""

from __future__ import annotations

import pytest
import torch

from helpers.dist_utils import run_distributed

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

VARIANTS = [("transformer_engine", False), ("transformer_engine", True), ("local", False), ("local", True),
            ("transformer_engine:unfused", False), ("transformer_engine:unfused", True)]
# bf16 model vs fp32 HF, |log-prob| ~ 6 at temperature 0.7 (measured H100 2026-11-23:
# see benchmarks/RESULTS.md); attending to the padding moves them by ~0.3 on average.
MEAN_TOL, MAX_TOL = 0.02, 0.15


@pytest.fixture(scope="module", params=["qwen2", "qwen3"])
def te_runs(request, tmp_path_factory):
    pytest.importorskip("transformer_engine")
    from te_bodies import actor_runs, grpo_batch, hf_log_probs, make_model

    model_dir = make_model(str(tmp_path_factory.mktemp("te") / request.param), request.param)
    batch = grpo_batch()
    runs = run_distributed(actor_runs, 1, model_dir, batch, VARIANTS, timeout=600)[0]
    return {"runs": runs, "batch": batch, "hf": hf_log_probs(model_dir, batch),
            "hf_no_mask": hf_log_probs(model_dir, batch, use_mask=False), "name": request.param}


def _diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    d = (a - b)[mask.bool()].abs()
    return float(d.mean()), float(d.max())


def test_spec_is_the_one_asked_for(te_runs):
    for (impl, packed), r in te_runs["runs"].items():
        assert r["built"] == impl.split(":")[0], (impl, packed)


def test_te_fusions_are_on_by_default_and_give_the_unfused_gradients(te_runs):
    runs = te_runs["runs"]
    for packed in (False, True):
        fused, unfused = runs[("transformer_engine", packed)], runs[("transformer_engine:unfused", packed)]
        assert fused["rope_fusion"] and fused["wgrad_fused_modules"] > 0, packed
        assert not unfused["rope_fusion"] and unfused["wgrad_fused_modules"] == 0, packed
        assert fused["main_grads"].keys() == unfused["main_grads"].keys()
        for name, want in unfused["main_grads"].items():
            got = fused["main_grads"][name]
            # the unfused run rounds each micro-batch's weight gradient to bf16 before adding it;
            # a lost micro-batch (overwrite instead of accumulate) would be off by ~50 %
            rel = float((got - want).norm() / want.norm().clamp(min=1e-12))
            assert rel < 0.05, (te_runs["name"], packed, name, rel)


def test_log_probs_match_hf_padded_and_packed(te_runs):
    mask = te_runs["batch"]["response_mask"]
    sens_mean, _ = _diff(te_runs["hf"], te_runs["hf_no_mask"], mask)
    assert sens_mean > 5 * MEAN_TOL, f"batch too insensitive to padding: {sens_mean}"
    for key, r in te_runs["runs"].items():
        assert torch.isfinite(r["log_probs"]).all(), key
        mean, worst = _diff(r["log_probs"], te_runs["hf"], mask)
        print(f"{te_runs['name']} {key}: |logp - HF| mean {mean:.4f} max {worst:.4f} (no-mask HF: {sens_mean:.4f})")
        assert mean < MEAN_TOL and worst < MAX_TOL, (key, mean, worst)


def test_update_gradients_finite_and_te_matches_sdpa(te_runs):
    runs = te_runs["runs"]
    for key, r in runs.items():
        assert not r["nonfinite_grads"], (key, r["nonfinite_grads"][:5])
        assert torch.isfinite(torch.tensor(r["grad_norm"])), key
    for packed in (False, True):
        te, sdpa = runs[("transformer_engine", packed)]["grad_norm"], runs[("local", packed)]["grad_norm"]
        assert te == pytest.approx(sdpa, rel=0.05), (packed, te, sdpa)


def test_te_parameters_are_exactly_the_converted_ones(te_runs):
    """Every TE parameter is loaded from HF (load_hf_weights raises on an unmapped one), the
    HF export gives the checkpoint back bit for bit (in the model's dtype), and the names
    differ from the local spec's only by the fused norms."""
    for key, r in te_runs["runs"].items():
        assert not r["export_mismatch"], (key, r["export_mismatch"][:5])
    te = set(te_runs["runs"][("transformer_engine", False)]["param_names"])
    local = set(te_runs["runs"][("local", False)]["param_names"])
    renamed = {n.replace("input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight")
                .replace("pre_mlp_layernorm.weight", "mlp.linear_fc1.layer_norm_weight") for n in local}
    assert te == renamed, sorted(te ^ renamed)
