"""NVIDIA Nemotron-H (``nemotron_h``: Mamba-2, attention, squared-ReLU MLP and MoE layers, one kind per layer)
built in megatron-core from its HF config, against HF transformers.

Log-probs equal HF's eager fp32 forward (atol 1e-5) on a batch whose rows have their padding after their tokens
(megatron's MambaMixer takes no padding mask; megarl's workers lay rows out so), through megatron's pipeline schedule
and packed as thd sequences (the Mamba kernels split at each sequence's start), at TP=1 and TP=2 (Mamba heads and
groups, convolution channels, attention heads, MLP, shared and routed experts split); the HF -> megatron -> HF
export is bitwise the safetensors (checkpoint names under ``backbone.``) on every rank. On CPU the Mamba kernels
are megarl's torch ones (megarl.compat.megatron_core.mamba_torch).
"""

from __future__ import annotations

import pytest
from helpers.dist_utils import run_distributed
from hf_tiny import assert_matches_hf, front_aligned, make_tiny_hf, padded_batch
from mcore_body import convert_and_forward

LAYOUTS = {
    "tp1": (1, {}),
    "tp2": (2, {"tensor_model_parallel_size": 2}),
}


@pytest.fixture(scope="module")
def nemotron_h_dir(tmp_path_factory):
    return make_tiny_hf("nemotron_h", str(tmp_path_factory.mktemp("nemotron_h")), num_layers=5)


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_logprobs_and_roundtrip(layout, nemotron_h_dir):
    world, megatron_cfg = LAYOUTS[layout]
    case = {"hf_dir": nemotron_h_dir, "batch": front_aligned(padded_batch(96)), "packed": True}
    per_rank = run_distributed(convert_and_forward, world, megatron_cfg, [case], timeout=240)
    assert_matches_hf(nemotron_h_dir, case["batch"], [r[0] for r in per_rank], packed=True)
