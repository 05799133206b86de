"""Direct weight sync into a CUDA vLLM engine (megarl.weight_sync.direct), against two
independent references: the checkpoint itself (fused by hand into vLLM's qkv / gate_up
rows, vocab rows padded with zeros) and vLLM's own ``reload_weights`` of the same weights.

Needs CUDA and vLLM (the GPU stack); actor TP=2 (gathers straight into vLLM's
parameters) needs 2 GPUs.
"""

from __future__ import annotations

import pytest
import torch

from helpers.dist_utils import run_distributed

pytestmark = [pytest.mark.gpu, pytest.mark.slow]
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _expected_vllm_param(name: str, shape, checkpoint: dict, tp: int, rank: int) -> torch.Tensor:
    """What vLLM rank ``rank`` of ``tp`` holds of parameter ``name`` (shape ``shape``): each HF
    part split by vLLM's rule (column parallel: rows; row parallel o_proj / down_proj: columns;
    vocabulary: rows of the table padded to ``shape[0] * tp``), fused parts concatenated."""
    module, _, leaf = name.rpartition(".")
    owner, _, fused = module.rpartition(".")
    parts = [f"{owner}.{p}.{leaf}" for p in FUSED[fused]] if fused in FUSED else [name]
    tensors = [checkpoint[p] for p in parts]
    if name.endswith(("embed_tokens.weight", "lm_head.weight")):
        table = tensors[0]
        padded = torch.cat([table, table.new_zeros(shape[0] * tp - table.shape[0], *table.shape[1:])])
        return padded.chunk(tp)[rank]
    if tp > 1 and leaf == "weight" and module.endswith(("o_proj", "down_proj")):
        return tensors[0].chunk(tp, dim=1)[rank]
    if tp > 1 and tensors[0].dim() and not module.endswith(("norm", "o_proj", "down_proj")):
        tensors = [t.chunk(tp)[rank] for t in tensors]
    return torch.cat(tensors)


@pytest.mark.parametrize("actor_tp,rollout_tp,tie,vocab", [(1, 1, False, None), (1, 1, True, None), (2, 1, False, None),
                                                           (2, 2, False, 128)],
                         ids=["tp1", "tp1_tied", "tp2_gather_into_vllm", "tp2_shard_to_shard"])
def test_direct_sync_equals_checkpoint_and_vllm_reload(tmp_path, actor_tp, rollout_tp, tie, vocab):
    """``vocab`` 128: vLLM pads the vocabulary to a multiple of 64, megatron to the TP size; with
    a vocabulary both leave unpadded each rank's shards line up (the shard-to-shard condition)."""
    pytest.importorskip("vllm")
    if torch.cuda.device_count() < actor_tp:
        pytest.skip(f"needs {actor_tp} CUDA GPUs")
    from gpu_bodies import direct_sync_into_vllm
    from helpers.tiny_hf import build_tiny_qwen2

    hf_dir = build_tiny_qwen2(tmp_path / "model", tie=tie, vocab=vocab)
    results = run_distributed(direct_sync_into_vllm, actor_tp, str(hf_dir), actor_tp, rollout_tp, timeout=600)
    for rank, r in enumerate(results):
        assert r["direct"], "the direct path was not chosen on CUDA"
        assert r["local"] == (actor_tp == rollout_tp), "shard to shard exactly when the layouts match"
        assert r["metrics"]["weight_sync/direct"] == 1.0
        for name, got in r["loaded"].items():
            want = _expected_vllm_param(name, got.shape, r["checkpoint"], rollout_tp, r["tp_rank"]).to(got.dtype)
            assert torch.equal(got, want), f"rank {rank}: vLLM {name} after the direct sync != checkpoint"
        assert r["after_direct"].keys() == r["after_reload"].keys()
        for name in r["after_direct"]:
            assert torch.equal(r["after_direct"][name], r["after_reload"][name]), f"rank {rank}: {name} direct != reload"
        assert any(not torch.equal(r["after_direct"][n], r["loaded"][n]) for n in r["loaded"])  # the perturbation arrived
        assert r["greedy"][0] == r["greedy"][1]
