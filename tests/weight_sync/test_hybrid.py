"""ActorRolloutRefWorker on 2 ranks: Megatron TP=2 actor + vLLM engines in the same
processes; the first generation syncs the (perturbed) actor weights into vLLM.

Checks against independent references: HF transformers greedy decoding and forward
log-probs on the perturbed HF checkpoint, and agreement of vLLM's sampled-token
log-probs with the Megatron actor's at the same temperature (fp32, < 1e-4).
"""

from __future__ import annotations

import pytest
import torch

from helpers.dist_utils import run_distributed
from sync_body import expected_hf_weights, hybrid_generate_and_score
from helpers.tiny_hf import build_tiny_qwen2

pytestmark = pytest.mark.slow

SCALE, SHIFT, T = 1.02, -0.002, 0.7
ROWS = [[5, 6, 7], [11, 12, 13, 14, 15]]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    hf_dir = build_tiny_qwen2(tmp_path_factory.mktemp("hybrid_qwen2"))
    # The perturbed checkpoint, as HF transformers sees it: the reference.
    from safetensors.torch import save_file
    import shutil

    ref_dir = tmp_path_factory.mktemp("hybrid_expected")
    for f in ("config.json", "generation_config.json"):
        shutil.copy(hf_dir / f, ref_dir / f)
    save_file(expected_hf_weights(str(hf_dir), SCALE, SHIFT), str(ref_dir / "model.safetensors"))
    return hf_dir, ref_dir


def _hf_greedy(ref_dir, rows, R):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ref_dir, dtype=torch.float32).eval()
    out = []
    for row in rows:
        with torch.no_grad():
            gen = model.generate(torch.tensor([row]), max_new_tokens=R, do_sample=False, pad_token_id=0)
        out.append(gen[0, len(row):].tolist())
    return out


@pytest.mark.parametrize("rollout_tp", [1, 2], ids=["vllm_tp1_per_rank", "vllm_tp2_one_replica"])
def test_hybrid_sync_generate_and_log_prob_agreement(dirs, rollout_tp):
    hf_dir, ref_dir = dirs
    overrides = {
        "actor.megatron.tensor_model_parallel_size": 2,
        "rollout.tensor_model_parallel_size": rollout_tp,
        "rollout.n": 2,
        "rollout.temperature": T,
        "rollout.ignore_eos": True,
        "rollout.weight_sync.bucket_size_mb": 0.1,
        "rollout.weight_sync.integrity_check": True,
    }
    results = run_distributed(hybrid_generate_and_score, 2, str(hf_dir), overrides, ROWS, SCALE, SHIFT, T,
                              timeout=600)
    hf_greedy = _hf_greedy(ref_dir, ROWS, 6)
    for rank, res in enumerate(results):
        # Greedy after sync = HF greedy on the perturbed checkpoint: weights arrived.
        assert res["greedy"].tolist() == hf_greedy, f"rank {rank}"
        assert not res["greedy_resynced"]  # no update since the last sync
        # vLLM's sampled-token log-probs vs the Megatron actor at the same temperature.
        assert res["temperature"] == T
        mask = res["sampled"]["response_mask"].bool()
        gap = (res["sampled"]["rollout_log_probs"] - res["old_log_probs"]).abs()[mask]
        assert gap.max() < 1e-4, f"rank {rank}: max |rollout - actor| = {gap.max():.2e}"
        assert res["gap"]["rollout/log_prob_gap_max"] == pytest.approx(float(gap.max()), abs=1e-7)
        # The reference still has the original weights.
        assert (res["ref_log_prob"] - res["old_log_probs"]).abs()[mask].max() > 1e-3
        sync = res["sync"]
        assert sync["weight_sync/direct"] == 0.0  # CPU: vLLM repacks weights, the reload path runs
        assert sync["weight_sync/bytes"] == sum(t.numel() * 4 for t in expected_hf_weights(str(hf_dir), 1, 0).values())
        assert sync["weight_sync/buckets"] > 1
        info = res["dispatch"]
        assert info["rollout_replicas"] == 2 // rollout_tp and info["rollout_replica"] == rank // rollout_tp
    # Replicas sample independently (different seeds); one replica's ranks agree.
    same = torch.equal(results[0]["local_responses"], results[1]["local_responses"])
    assert same == (rollout_tp == 2)
