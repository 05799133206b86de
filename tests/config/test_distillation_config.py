"""distillation.*: verl's keys typed, verl's own checks and megarl's refusals named by key."""

from __future__ import annotations

import pytest

from config_testing import issue_for, no_issues, write_model

D = "distillation"
LOSS = f"{D}.distillation_loss"
T = f"{D}.teacher_models.teacher_model"


@pytest.fixture
def distil(make, tmp_path):
    """make() with distillation on, a teacher of the student's vocabulary (TP 1: the CPU world has 1 rank)."""
    write_model(tmp_path / "teacher")

    def _make(overrides: dict | None = None):
        return make({f"{D}.enabled": True, f"{T}.model_path": str(tmp_path / "teacher"),
                     f"{T}.inference.tensor_model_parallel_size": 1, **(overrides or {})})

    return _make


def test_enabled_distillation_validates_and_types(distil, tmp_path):
    from megarl.config.read import typed_config

    cfg = distil({f"{LOSS}.loss_mode": "forward_kl_topk", f"{LOSS}.topk": 5, f"{T}.inference.max_num_seqs": 3})
    no_issues(cfg)
    d = typed_config(cfg).distillation
    assert d.enabled and d.uses_topk() and d.distillation_loss.topk == 5
    assert d.teacher_models.teacher_model.model_path == str(tmp_path / "teacher")
    assert d.teacher_models.teacher_model.inference.max_num_seqs == 3
    # verl's interpolations: the teacher sees the student's lengths and temperature
    inference = d.teacher_models.teacher_model.inference
    assert inference.temperature == typed_config(cfg).actor_rollout_ref.rollout.temperature


def test_k1_needs_policy_gradient(distil):
    issue_for(distil({f"{LOSS}.loss_mode": "k1"}), f"{LOSS}.loss_mode", "k1", "use_policy_gradient=true")
    no_issues(distil({f"{LOSS}.loss_mode": "k1", f"{LOSS}.use_policy_gradient": True}))


def test_only_vanilla_policy_loss(distil):
    issue_for(distil({f"{LOSS}.policy_loss_mode": "gspo"}), f"{LOSS}.policy_loss_mode", "vanilla")


def test_unknown_loss_mode_and_topk_required(distil):
    issue_for(distil({f"{LOSS}.loss_mode": "reverse_kl"}), f"{LOSS}.loss_mode", "forward_kl_topk")
    issue_for(distil({f"{LOSS}.loss_mode": "forward_kl_topk", f"{LOSS}.topk": None}), f"{LOSS}.topk", "topk")


def test_teacher_context_must_hold_prompt_and_response(distil):
    issue_for(distil({f"{T}.inference.max_model_len": 40}), f"{T}.inference.max_model_len", "41")
    no_issues(distil({f"{T}.inference.max_model_len": 41}))


def test_teacher_model_dir_vocab_and_layout(distil, tmp_path):
    issue_for(distil({f"{T}.model_path": None}), f"{T}.model_path", "no model directory")
    write_model(tmp_path / "teacher", vocab_size=999)
    issue_for(distil(), f"{T}.model_path", "vocab_size 999")
    write_model(tmp_path / "teacher")
    issue_for(distil({f"{T}.inference.tensor_model_parallel_size": 2}), f"{T}.inference.tensor_model_parallel_size",
              "trainer world")
    issue_for(distil({f"{D}.nnodes": 1, f"{D}.n_gpus_per_node": 3, f"{T}.inference.tensor_model_parallel_size": 2}),
              f"{T}.inference.tensor_model_parallel_size", "teacher pool")


@pytest.mark.parametrize("key, value", [
    (f"{T}.inference.data_parallel_size", 2),
    (f"{T}.inference.expert_parallel_size", 2),
    (f"{T}.inference.limit_images", 2),
])
def test_teacher_settings_megarl_cannot_honour_are_refused(distil, key, value):
    issue_for(distil({key: value}), key, "not supported")


def test_vllm_only_teacher_settings_are_accepted(distil):
    from megarl.config.verl_compat.check import compat_notices

    cfg = distil({f"{T}.inference.gpu_memory_utilization": 0.4, f"{T}.inference.name": "vllm"})
    no_issues(cfg)
    assert any(n.startswith(f"{T}.inference.gpu_memory_utilization=0.4 has no effect") for n in compat_notices(cfg))


def test_a_second_teacher_is_refused(distil, tmp_path):
    issue_for(distil({f"{D}.teacher_models.teacher_model2": {"key": "math", "model_path": str(tmp_path / "teacher")}}),
              f"{D}.teacher_models.teacher_model2", "one teacher", "teacher_key")


def test_verl_megatron_example_distillation_keys_pass(make, tmp_path):
    """The `distillation.*` part of verl's examples/on_policy_distillation_trainer/run_qwen3_8b_megatron.sh
    (teacher on its own pool of 4 GPUs, TP 2, forward_kl_topk without task rewards), verbatim."""
    from megarl.config.read import typed_config

    write_model(tmp_path / "teacher")
    cfg = make({
        "algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 1,  # the advantages go unused
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 8,  # the fixture's mini-batch at n=1
        "model_engine": "megatron", "distillation.enabled": True, "distillation.n_gpus_per_node": 4,
        "distillation.nnodes": 1, f"{T}.model_path": str(tmp_path / "teacher"),
        f"{T}.inference.tensor_model_parallel_size": 2, f"{T}.inference.name": "vllm",
        f"{T}.inference.gpu_memory_utilization": 0.4, f"{T}.inference.max_model_len": 1024 + 2048 + 1,
        f"{LOSS}.loss_mode": "forward_kl_topk", f"{LOSS}.topk": 64, f"{LOSS}.use_task_rewards": False,
        f"{LOSS}.use_policy_gradient": False, f"{LOSS}.loss_max_clamp": 10.0, f"{LOSS}.log_prob_min_clamp": -10.0,
    })
    no_issues(cfg)
    loss = typed_config(cfg).distillation.distillation_loss
    assert (loss.topk, loss.use_task_rewards, loss.loss_max_clamp, loss.log_prob_min_clamp) == (64, False, 10.0, -10.0)


def test_grpo_group_of_one_is_refused_while_the_task_reward_counts(distil):
    over = {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 1}
    issue_for(distil({**over, f"{LOSS}.use_task_rewards": True}), "actor_rollout_ref.rollout.n", "group of >= 2")


def test_teacher_tp_over_kv_heads(distil, tmp_path):
    """The teacher's TP may be a multiple of its KV heads (replicated, as the actor's: megatron-core and vLLM
    both replicate each head); TP must still divide its query heads, and divide or be a multiple of its KV heads."""
    from megarl.config import collect_issues
    from megarl.preflight import RUNTIME_RULES

    pool = {f"{D}.nnodes": 1, f"{D}.n_gpus_per_node": 4, f"{T}.inference.tensor_model_parallel_size": 4}
    write_model(tmp_path / "teacher", num_attention_heads=4, num_key_value_heads=2)
    key = f"{T}.inference.tensor_model_parallel_size"
    assert [i.format() for i in collect_issues(distil(pool), RUNTIME_RULES) if i.key == key] == []
    write_model(tmp_path / "teacher", num_attention_heads=6, num_key_value_heads=3, hidden_size=96)
    issue_for(distil({**pool, f"{T}.inference.tensor_model_parallel_size": 2}), key,
              "num_key_value_heads=3", "nor is a multiple")
