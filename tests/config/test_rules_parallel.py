"""Parallel layout rules, including the model-shape ones (config.json in a tmp dir)."""

from __future__ import annotations

import pytest

from config_testing import issue_for, no_issues

M = "actor_rollout_ref.actor.megatron"
R = "actor_rollout_ref.rollout"


def test_tp_pp_cp_must_divide_world(make):
    cfg = make({"trainer.n_gpus_per_node": 2, f"{M}.pipeline_model_parallel_size": 4})
    issue_for(cfg, f"{M}.tensor_model_parallel_size", "pp=4", "world size")


def test_ref_layout_checked_when_ref_runs(make):
    cfg = make({"trainer.n_gpus_per_node": 2, "actor_rollout_ref.ref.megatron.tensor_model_parallel_size": 4, "algorithm.use_kl_in_reward": True})
    issue_for(cfg, "actor_rollout_ref.ref.megatron.tensor_model_parallel_size", "world size")


def test_ep_times_etp_must_divide_world_per_stage(make):
    cfg = make({"trainer.n_gpus_per_node": 4, f"{M}.pipeline_model_parallel_size": 2, f"{M}.expert_model_parallel_size": 4,
                f"{M}.expert_tensor_parallel_size": 1}, hf={"model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32})
    issue_for(cfg, f"{M}.expert_model_parallel_size", "world / pp = 2")


def test_vpp_needs_pp(make):
    issue_for(make({f"{M}.virtual_pipeline_model_parallel_size": 2}), f"{M}.virtual_pipeline_model_parallel_size", "pipeline_model_parallel_size > 1")


def test_attention_heads_divisible_by_tp(make):
    cfg = make({"trainer.n_gpus_per_node": 3, f"{M}.tensor_model_parallel_size": 3, f"{M}.ppo_micro_batch_size_per_gpu": 1}, hf={"num_key_value_heads": 4})
    issue_for(cfg, f"{M}.tensor_model_parallel_size", "num_attention_heads=4")


def test_kv_heads_divide_tp_or_tp_divides_them(make):
    # TP 4 over 2 KV heads: Megatron-Core replicates each over 2 ranks (tests/models/test_megatron_vs_hf.py)
    no_issues(make({"trainer.n_gpus_per_node": 4, f"{M}.tensor_model_parallel_size": 4},
                   hf={"num_attention_heads": 8, "num_key_value_heads": 2}))
    cfg = make({"trainer.n_gpus_per_node": 3, f"{M}.tensor_model_parallel_size": 3, f"{M}.ppo_micro_batch_size_per_gpu": 1},
               hf={"num_attention_heads": 12, "num_key_value_heads": 4})
    issue_for(cfg, f"{M}.tensor_model_parallel_size", "neither divides num_key_value_heads=4 ", "nor is a multiple")


def test_layers_divisible_by_pp_times_vpp(make):
    cfg = make({"trainer.n_gpus_per_node": 2, f"{M}.pipeline_model_parallel_size": 2, f"{M}.virtual_pipeline_model_parallel_size": 4})
    issue_for(cfg, f"{M}.pipeline_model_parallel_size", "num_hidden_layers=4")
    no_issues(make({"trainer.n_gpus_per_node": 2, f"{M}.pipeline_model_parallel_size": 2, f"{M}.virtual_pipeline_model_parallel_size": 2}))


def test_override_config_is_applied_before_shape_checks(make):
    cfg = make({"trainer.n_gpus_per_node": 2, f"{M}.pipeline_model_parallel_size": 2,
                "actor_rollout_ref.model.override_config": {"num_hidden_layers": 3}})
    issue_for(cfg, f"{M}.pipeline_model_parallel_size", "num_hidden_layers=3")


def test_ep_on_dense_model(make):
    issue_for(make({"trainer.n_gpus_per_node": 2, f"{M}.expert_model_parallel_size": 2}), f"{M}.expert_model_parallel_size", "no MoE experts")


def test_experts_divisible_by_ep(make):
    cfg = make({"trainer.n_gpus_per_node": 4, f"{M}.expert_model_parallel_size": 4}, hf={"model_type": "qwen3_moe", "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 32})
    issue_for(cfg, f"{M}.expert_model_parallel_size", "6 experts")


def test_rollout_tp_must_divide_world(make):
    issue_for(make({f"{R}.tensor_model_parallel_size": 2}), f"{R}.tensor_model_parallel_size", "world size")


def test_rollout_tp_vs_kv_heads(make):
    # 8 heads, 4 KV heads: vLLM TP 8 replicates KV heads (fine); TP 2 splits them (fine).
    no_issues(make({"trainer.n_gpus_per_node": 8, f"{R}.tensor_model_parallel_size": 8, "data.train_batch_size": 16,
                    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 8}, hf={"num_attention_heads": 8, "num_key_value_heads": 4}))
    cfg = make({"trainer.n_gpus_per_node": 3, f"{R}.tensor_model_parallel_size": 3, "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
                "data.train_batch_size": 24, "actor_rollout_ref.rollout.n": 3, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 8},
               hf={"num_attention_heads": 6, "num_key_value_heads": 2})
    issue_for(cfg, f"{R}.tensor_model_parallel_size", "num_key_value_heads=2")


def test_sequence_parallel_runs_without_te(make):
    """megarl's torch norms run under sequence parallelism (megarl.models.spec.SequenceParallelTorchNorm)."""
    two = {"trainer.n_gpus_per_node": 2, f"{M}.tensor_model_parallel_size": 2}
    no_issues(make({**two, f"{M}.sequence_parallel": True}))


def test_sequence_parallel_at_tp1_is_a_no_op_as_in_verls_default(make):
    no_issues(make({f"{M}.sequence_parallel": True}))


def test_context_parallel_is_accepted_without_transformer_engine(make):
    """CP runs on the SDPA spec (megarl.models.cp_attention) as well as on TE's attention."""
    no_issues(make({"trainer.n_gpus_per_node": 2, f"{M}.context_parallel_size": 2}))
    no_issues(make({"trainer.n_gpus_per_node": 4, f"{M}.context_parallel_size": 2, f"{M}.tensor_model_parallel_size": 2,
                    f"{M}.sequence_parallel": True, "actor_rollout_ref.model.use_remove_padding": True}))


def test_context_parallel_must_fit_the_world(make):
    issue_for(make({"trainer.n_gpus_per_node": 2, f"{M}.context_parallel_size": 4}), f"{M}.tensor_model_parallel_size", "cp=4")


@pytest.mark.parametrize("key, value", [("dynamic_context_parallel", True), ("max_seqlen_per_dp_cp_rank", 4096)])
def test_dynamic_context_parallel_is_refused_by_key(make, key, value):
    issue_for(make({f"{M}.{key}": value}), f"{M}.{key}", "dynamic context parallelism")


def test_dist_checkpointing_needs_an_existing_dir(make, tmp_path):
    issue_for(make({f"{M}.use_dist_checkpointing": True}), f"{M}.dist_checkpointing_path", "not an existing directory")
    no_issues(make({f"{M}.use_dist_checkpointing": True, f"{M}.dist_checkpointing_path": str(tmp_path)}))


def test_interleaved_pipeline_accepts_packing_and_dynamic_batch_size(make):
    """run_schedule pads VPP micro-batches to one shape (tests/workers: test_vpp_variable_shapes_match_tp1)."""
    base = {"trainer.n_gpus_per_node": 2, f"{M}.pipeline_model_parallel_size": 2, f"{M}.virtual_pipeline_model_parallel_size": 2,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 8}
    no_issues(make(base, hf={"num_hidden_layers": 4}))
    no_issues(make({**base, "actor_rollout_ref.actor.use_dynamic_bsz": True, "actor_rollout_ref.model.use_remove_padding": True},
                   hf={"num_hidden_layers": 4}))
