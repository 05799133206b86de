"""Qwen3.5 text (gated DeltaNet and gated-attention layers, zero-centred norms, partial rotary) built in
megatron-core from its HF config, against HF transformers.

Log-probs equal HF's eager fp32 forward (atol 1e-5) on a batch whose rows have their padding after their tokens
(megatron's GatedDeltaNet takes no padding mask; megarl's workers lay rows out so), through megatron's pipeline
schedule and packed as thd sequences, at TP=1 and TP=2 (DeltaNet heads, convolution channels and gated attention
split); the HF -> megatron -> HF export is bitwise the safetensors on every rank. On CPU the DeltaNet kernels are
megarl's torch ones (megarl.compat.megatron_core.gdn_torch); PP=2 with ``-m extended``.
"""

from __future__ import annotations

import pytest
from helpers.dist_utils import run_distributed
from hf_tiny import assert_matches_hf, front_aligned, make_tiny_hf, padded_batch
from mcore_body import convert_and_forward

pytestmark = pytest.mark.slow

LAYOUTS = {
    "tp1": (1, {}),
    "tp2": (2, {"tensor_model_parallel_size": 2}),
    "pp2": (2, {"pipeline_model_parallel_size": 2}),
}
EXTENDED = ("pp2",)


@pytest.fixture(scope="module")
def qwen3_5_dir(tmp_path_factory):
    return make_tiny_hf("qwen3_5", str(tmp_path_factory.mktemp("qwen3_5")))


@pytest.mark.parametrize("layout", [pytest.param(name, marks=pytest.mark.extended) if name in EXTENDED else name
                                    for name in LAYOUTS])
def test_logprobs_and_roundtrip(layout, qwen3_5_dir):
    world, megatron_cfg = LAYOUTS[layout]
    packed = layout not in EXTENDED
    case = {"hf_dir": qwen3_5_dir, "batch": front_aligned(padded_batch(96)), "packed": packed}
    per_rank = run_distributed(convert_and_forward, world, megatron_cfg, [case], timeout=300)
    assert_matches_hf(qwen3_5_dir, case["batch"], [r[0] for r in per_rank], packed=packed)


@pytest.mark.gpu
def test_flash_linear_attention_kernels_match_hf(qwen3_5_dir):
    """One GPU with flash-linear-attention: fla's DeltaNet kernels in the same local-spec model, against HF's fp32
    forward within tests/models/test_gpu_moe.py's tolerance (fla computes in lower precision inside)."""
    import torch
    from hf_tiny import hf_token_log_probs

    pytest.importorskip("fla")
    batch = front_aligned(padded_batch(96))
    res = run_distributed(convert_and_forward, 1, {}, [{"hf_dir": qwen3_5_dir, "batch": batch, "packed": True}],
                          "cuda", timeout=300)[0][0]
    expected = hf_token_log_probs(qwen3_5_dir, *batch)
    valid = (batch[1][:, :-1] * batch[1][:, 1:]).bool()
    for got in (res["result"], res["packed"]):
        torch.testing.assert_close(got[valid], expected[valid], atol=2e-4, rtol=1e-4)
