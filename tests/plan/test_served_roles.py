"""The forward-only roles in the plan: the distillation teacher (megarl.workers.teacher) and the
reward model (megarl.workers.reward_model), each from its own config.json, layout keys and
free_cache_engine; the teacher on the trainer's GPUs (distillation.nnodes=0) or on its own pool;
the distillation student's forward_kl_topk loss in update_actor. Figures by hand from the
models' sizes."""

from __future__ import annotations

import json

import pytest

from megarl.config import resolve_config
from megarl.config.compose import load_config
from megarl.plan.__main__ import main as plan_main
from megarl.plan.build import GIB, build_plan
from megarl.plan.overhead import CUDA_CONTEXT, TRAINER_PROCESS

QWEN25_7B = dict(model_type="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                 num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False)
QWEN25_7B_PARAMS = 7_615_616_512  # published
QWEN25_32B = dict(model_type="qwen2", vocab_size=152064, hidden_size=5120, intermediate_size=27648,
                  num_hidden_layers=64, num_attention_heads=40, num_key_value_heads=8, tie_word_embeddings=False)
QWEN25_32B_PARAMS = 32_763_876_352  # published

T = "distillation.teacher_models.teacher_model"
TEACHER_TP = f"{T}.inference.tensor_model_parallel_size"
RM = "reward.reward_model"
SEQ = 1024 + 3072
# 7B student, GRPO without KL (no reference, no critic), TP=4 on 2 x 8 GPUs: fits 80 GiB GPUs
STUDENT = ("algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4",
           "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
           "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
           "data.train_batch_size=64", "actor_rollout_ref.rollout.n=4")


def _dir(tmp_path, name: str, config: dict) -> str:
    path = tmp_path / name
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def _cfg(tmp_path, *overrides, nodes=2, gpus=8):
    return resolve_config(load_config([
        f"actor_rollout_ref.model.path={_dir(tmp_path, 'student', QWEN25_7B)}",
        f"trainer.nnodes={nodes}", f"trainer.n_gpus_per_node={gpus}",
        "data.max_prompt_length=1024", "data.max_response_length=3072",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4", *STUDENT, *overrides]))


def _teacher(tmp_path, *overrides, config=QWEN25_32B):
    return ("distillation.enabled=true", f"{T}.model_path={_dir(tmp_path, 'teacher', config)}", *overrides)


def _reward_model(tmp_path, *overrides, config=QWEN25_7B):
    return (f"{RM}.enable=true", f"{RM}.rollout.name=vllm", f"{RM}.model_path={_dir(tmp_path, 'rm', config)}",
            *overrides)


def _plan(cfg, gib=80):
    return build_plan(cfg, gpu_memory_gib=gib, host_memory_gib=None)


def _text(plan) -> str:
    return "\n".join(i.format() for i in plan.issues)


def test_teacher_weights_per_gpu_by_hand(tmp_path):
    """32B teacher in bf16 at TP=4 over the trainer's 16 GPUs: every weight / 4 (one stage),
    2 bytes each; DP = 4; offloaded between calls (free_cache_engine, verl's default)."""
    plan = _plan(_cfg(tmp_path, *_teacher(tmp_path, f"{TEACHER_TP}=4")))
    teacher = plan.roles["teacher"]
    assert teacher.params.total == QWEN25_32B_PARAMS
    assert (teacher.layout.tp, teacher.layout.dp) == (4, 4)
    assert teacher.memory.params == 2 * QWEN25_32B_PARAMS // 4
    assert teacher.memory.grads == teacher.memory.optimizer == 0
    p = plan.phases
    assert p["teacher_log_prob"].terms["teacher params"] == 2 * QWEN25_32B_PARAMS // 4
    assert "teacher params" not in p["generate"].terms and "teacher params" not in p["update_actor"].terms
    assert teacher.offloaded == 2 * QWEN25_32B_PARAMS // 4
    # built whole before the actor (init_workers), then offloaded: in init alone, one process more
    assert p["init"].terms["overhead"] == TRAINER_PROCESS + CUDA_CONTEXT
    # free_cache_engine=false: resident in every phase
    kept = _plan(_cfg(tmp_path, *_teacher(tmp_path, f"{TEACHER_TP}=4", f"{T}.inference.free_cache_engine=false")))
    assert kept.phases["generate"].terms["teacher params"] == 2 * QWEN25_32B_PARAMS // 4
    assert kept.roles["teacher"].offloaded == 0


def test_teacher_forward_top_k_by_hand(tmp_path):
    """forward_kl_topk: the teacher's log-softmax over its vocabulary slice in fp32 (4 bytes more
    per logit than the estimators' log-prob of the sampled token) and the [tokens, k] fp32 + int64
    outputs; micro-batches of max_num_seqs rows, at most a DP rank's share of the batch."""
    def forward(*overrides):
        return _plan(_cfg(tmp_path, *_teacher(tmp_path, f"{TEACHER_TP}=4", *overrides))).roles["teacher"].memory

    k3 = forward("distillation.distillation_loss.loss_mode=k3", f"{T}.inference.max_num_seqs=2")
    topk = forward("distillation.distillation_loss.loss_mode=forward_kl_topk", "distillation.distillation_loss.topk=64",
                   f"{T}.inference.max_num_seqs=2")
    tokens = 2 * SEQ
    assert topk.activations_forward - k3.activations_forward == pytest.approx(
        tokens * (152064 / 4 * 4 + 64 * 12), rel=1e-6)
    # 64 prompts x 4 responses over DP=4: 64 rows per rank, fewer than max_num_seqs=1024 (verl's default)
    share = forward("distillation.distillation_loss.loss_mode=k3")
    assert share.activations_forward == pytest.approx(32 * k3.activations_forward, rel=1e-6)


def test_colocated_big_teacher_is_refused_naming_its_keys(tmp_path):
    alone = _plan(_cfg(tmp_path))
    assert not alone.issues, _text(alone)
    plan = _plan(_cfg(tmp_path, *_teacher(tmp_path, f"{TEACHER_TP}=1", f"{T}.inference.max_num_seqs=1")))
    # 65.5 GB of bf16 weights at TP=1 beside the student's resident state
    assert plan.phases["teacher_log_prob"].total > 80 * GIB
    issue = next(i for i in plan.issues if "phase teacher_log_prob" in i.problem)
    assert issue.key == TEACHER_TP and issue.value == 1
    assert f"{T}.inference.max_num_seqs" in issue.fix and "distillation.nnodes > 0" in issue.fix
    assert f"{T}.inference.pipeline_model_parallel_size" not in issue.fix  # the teacher has no PP key


def test_teacher_on_its_own_pool_leaves_the_trainer_gpus_alone(tmp_path):
    """distillation.nnodes > 0: the trainer's phases are those of the run without a teacher (an
    estimator loss: no student top-k); the teacher's phase is judged on its own GPUs, alone there."""
    alone = _plan(_cfg(tmp_path))
    own = ("distillation.nnodes=1", "distillation.n_gpus_per_node=4")
    plan = _plan(_cfg(tmp_path, *_teacher(tmp_path, f"{TEACHER_TP}=2", *own, f"{T}.inference.max_num_seqs=1")))
    trainer = {n: p for n, p in plan.phases.items() if n != "teacher_log_prob"}
    assert {n: p.terms for n, p in trainer.items()} == {n: p.terms for n, p in alone.phases.items()}
    teacher = plan.roles["teacher"]
    assert (teacher.layout.world_size, teacher.layout.tp, teacher.layout.dp) == (4, 2, 2)
    phase = plan.phases["teacher_log_prob"]
    assert phase.pool == "distillation"
    assert set(phase.terms) == {"teacher params", "teacher activations (forward)", "overhead"}
    assert phase.terms["teacher params"] == QWEN25_32B_PARAMS  # bf16 / TP=2
    assert not plan.issues, _text(plan)
    # 128 rows per DP rank of the teacher's pool: its logits do not fit its GPUs, refused with its pool's keys
    big = _plan(_cfg(tmp_path, *_teacher(tmp_path, f"{TEACHER_TP}=2", *own, f"{T}.inference.max_num_seqs=128")))
    issue = next(i for i in big.issues if "phase teacher_log_prob" in i.problem)
    assert issue.key == TEACHER_TP and "distillation.nnodes / distillation.n_gpus_per_node" in issue.fix
    assert "trainer.nnodes" not in issue.fix and "param_offload" not in issue.fix
    assert all("teacher_log_prob" in i.problem for i in big.issues)


def test_student_top_k_loss_by_hand(tmp_path):
    """forward_kl_topk in update_actor: over the response positions of a micro-batch (2 rows x
    3072), the bf16 slice of the student's logits and two fp32 copies (10 bytes per logit of
    vocab / TP=4) and the teacher's [tokens, k] inputs (12 bytes per entry)."""
    own = ("distillation.nnodes=1", "distillation.n_gpus_per_node=4")

    def train(mode):
        cfg = _cfg(tmp_path, *_teacher(tmp_path, *own, f"distillation.distillation_loss.loss_mode={mode}",
                                       "distillation.distillation_loss.topk=32"))
        return _plan(cfg).roles["actor"].memory.activations_train

    assert train("forward_kl_topk") - train("k3") == pytest.approx(2 * 3072 * (152064 / 4 * 10 + 32 * 12), rel=1e-6)


def test_reward_model_by_hand(tmp_path):
    """A 7B reward model at TP=2 on the trainer's GPUs: its weights with a value head ([1, hidden]
    instead of the LM head) / 2 in bf16; its forward one layer's activations, no vocabulary logits."""
    plan = _plan(_cfg(tmp_path, *_reward_model(tmp_path, f"{RM}.rollout.max_num_seqs=1")))
    rm = plan.roles["reward_model"]
    h = 3584
    assert rm.memory.params == 2 * (QWEN25_7B_PARAMS - 152064 * h + h) // 2
    # attention 2h + (q, k + v, out) / TP; MLP 2h + 3 ffn / TP; the larger layer, bf16, one row of 1024 + 3072
    per_token = (2 * h + (32 * 128 + 32 * 128) / 2) + (2 * h + 3 * 18944 / 2)
    assert rm.memory.activations_forward == pytest.approx(SEQ * per_token * 2, rel=1e-6)
    p = plan.phases
    assert set(p["reward_model"].terms) == {"reward_model params", "reward_model activations (forward)", "actor params",
                                            "actor grads", "actor optimizer", "overhead"}
    assert "reward_model params" not in p["generate"].terms  # free_cache_engine (default): offloaded
    assert p["generate"].terms["overhead"] == TRAINER_PROCESS + CUDA_CONTEXT


def test_resident_reward_model_is_refused_naming_its_keys(tmp_path):
    """A 32B reward model kept on the GPUs (free_cache_engine=false) at TP=1: 61 GiB beside vLLM's
    budget and the actor's state in generate; offloaded, the run fits a 96 GiB GPU (its scoring
    phase needs 82.9 GiB, the overhead included)."""
    rm = (f"{RM}.rollout.tensor_model_parallel_size=1", f"{RM}.rollout.max_num_seqs=1")
    assert not _plan(_cfg(tmp_path), gib=96).issues
    offloaded = _plan(_cfg(tmp_path, *_reward_model(tmp_path, *rm, config=QWEN25_32B)), gib=96)
    assert not offloaded.issues, _text(offloaded)
    plan = _plan(_cfg(tmp_path, *_reward_model(tmp_path, *rm, f"{RM}.rollout.free_cache_engine=false", config=QWEN25_32B)),
                 gib=96)
    issue = next(i for i in plan.issues if "phase generate" in i.problem)
    assert f"{RM}.rollout.free_cache_engine" in issue.fix
    assert plan.phases["generate"].terms["reward_model params"] == 2 * (QWEN25_32B_PARAMS - 152064 * 5120 + 5120)


def test_cli_refuses_a_colocated_teacher(tmp_path, capsys):
    """`python -m megarl.plan` (what main_ppo's gate builds): the same config fits without the
    teacher and is refused with a colocated 32B teacher at TP=1, naming its keys."""
    base = [f"actor_rollout_ref.model.path={_dir(tmp_path, 'student', QWEN25_7B)}", "trainer.nnodes=2",
            "trainer.n_gpus_per_node=8", "data.max_prompt_length=1024", "data.max_response_length=3072",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4", "trainer.total_training_steps=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=16", *STUDENT]
    assert plan_main(["--gpu-memory-gib=80", *base]) == 0, capsys.readouterr()
    capsys.readouterr()
    assert plan_main(["--gpu-memory-gib=80", *base, *_teacher(tmp_path, f"{TEACHER_TP}=1",
                                                              f"{T}.inference.max_num_seqs=1")]) == 2
    out = capsys.readouterr().out
    assert "REFUSED" in out and "phase teacher_log_prob" in out and f"{TEACHER_TP} = 1" in out
    assert "distillation.nnodes > 0" in out
