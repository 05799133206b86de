"""megarl's Megatron paths on CUDA + NCCL (2 GPUs), against independent references.

* log-probs / entropy at TP=2 and TP=1 (fp32) equal HF transformers' fp32 forward;
* one PPO step at TP=2 gives the same HF-exported weights as at TP=1 (fp32, NCCL);
* weight sync: the HF export of a TP=2 bf16 model equals the checkpoint it was loaded
  from bit for bit, and the bucketed export, the in-process stream (with checksums) and
  the NCCL broadcast stream deliver the same bits.

Skipped without CUDA (root conftest) or with fewer than 2 GPUs.
"""

from __future__ import annotations

import pytest
import torch

from helpers.dist_utils import run_distributed

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def _need_two_gpus():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from helpers.tiny import make_tiny_qwen2, rollout_batch

    root = tmp_path_factory.mktemp("gpu_paths")
    return {"path": make_tiny_qwen2(str(root / "model")), "batch": rollout_batch(8)}


@pytest.fixture(scope="module")
def actor_runs(tiny_model):
    _need_two_gpus()
    from gpu_bodies import actor_log_probs_and_step

    return {
        tp: run_distributed(actor_log_probs_and_step, 2, tiny_model["path"], tiny_model["batch"], tp, "float32", timeout=600)
        for tp in (1, 2)
    }


def _gather_rows(results) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of every DP rank, in row order (TP ranks of one DP group agree; take one)."""
    by_rows = {}
    for r in results:
        by_rows.setdefault(r["rows"], r)
    ordered = [by_rows[k] for k in sorted(by_rows)]
    return torch.cat([r["log_probs"] for r in ordered]), torch.cat([r["entropys"] for r in ordered])


def test_log_probs_tp1_tp2_match_hf_on_gpu(tiny_model, actor_runs):
    from helpers.tiny import TEMPERATURE
    from helpers.tiny import hf_response_log_probs

    ref_logp, ref_ent = hf_response_log_probs(tiny_model["path"], tiny_model["batch"], TEMPERATURE)
    for tp, results in actor_runs.items():
        logp, ent = _gather_rows(results)
        torch.testing.assert_close(logp, ref_logp, atol=1e-4, rtol=1e-4, msg=f"log-probs TP={tp}")
        torch.testing.assert_close(ent, ref_ent, atol=1e-4, rtol=1e-4, msg=f"entropy TP={tp}")


def test_update_step_tp2_equals_tp1_on_gpu(actor_runs):
    tp1 = actor_runs[1][0]["updated"]
    tp2 = actor_runs[2][0]["updated"]
    assert tp1.keys() == tp2.keys()
    for name in tp1:
        torch.testing.assert_close(tp2[name], tp1[name], atol=2e-5, rtol=1e-4, msg=name)


def test_weight_sync_bitwise_on_gpu(tiny_model):
    _need_two_gpus()
    from safetensors.torch import load_file
    import glob

    from gpu_bodies import weight_sync_bitwise

    results = run_distributed(weight_sync_bitwise, 2, tiny_model["path"], 4096, timeout=300)
    checkpoint = {}
    for f in glob.glob(f"{tiny_model['path']}/*.safetensors"):
        checkpoint.update(load_file(f))
    for rank, r in enumerate(results):
        assert r["per_tensor"].keys() == checkpoint.keys()
        for name, t in checkpoint.items():
            # bf16 weights; build_model keeps torch norms in fp32 (Float16Module casts them later)
            dtype = r["per_tensor"][name].dtype
            assert dtype == torch.bfloat16 or (dtype == torch.float32 and "norm" in name), (name, dtype)
            expected = t.to(dtype)
            for path in ("per_tensor", "bucketed", "bucketed_dest", "bucketed_small", "in_process", "broadcast"):
                got = r[path][name]
                assert got.dtype == dtype and torch.equal(got, expected), f"{path} {name} rank {rank}"
