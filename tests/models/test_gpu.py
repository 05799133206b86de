"""The same HF comparisons on CUDA (NCCL, CUDA init/seeding, fp32 without TF32), in the CPU tests' local
layer spec: transformer-engine's (built on CUDA wherever TE is installed) takes no padding mask and accumulates
weight gradients into DDP's main_grad, so it is compared packed in test_gpu_moe.py and tests/gpu/test_te_spec.py."""

from __future__ import annotations

import pytest
import torch
from helpers.dist_utils import run_distributed
from hf_tiny import assert_matches_hf, make_tiny_hf, padded_batch
from mcore_body import convert_and_forward
from test_megatron_vs_hf import _check_grads


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize(
    "megatron_cfg",
    [{"tensor_model_parallel_size": 2}, {"pipeline_model_parallel_size": 2},
     {"expert_model_parallel_size": 2}],
    ids=["tp2", "pp2", "ep2"],
)
def test_cuda_logprobs_grads_and_roundtrip(megatron_cfg, tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    names = ["qwen3_moe"] if "expert_model_parallel_size" in megatron_cfg else ["qwen2", "qwen3"]
    cases = []
    for name in names:
        hf_dir = make_tiny_hf(name, str(tmp_path / name))
        grad = "expert_model_parallel_size" not in megatron_cfg
        cases.append({"hf_dir": hf_dir, "batch": padded_batch(96), "packed": False, "grad": grad})
    local = {**megatron_cfg, "override_transformer_config": {"transformer_impl": "local"}}
    per_rank = run_distributed(convert_and_forward, 2, local, cases, "cuda", timeout=300)
    for index, case in enumerate(cases):
        assert_matches_hf(case["hf_dir"], case["batch"], [r[index] for r in per_rank], False)
        if case["grad"]:
            _check_grads(case["hf_dir"], case["batch"], [r[index]["grads"] for r in per_rank])
