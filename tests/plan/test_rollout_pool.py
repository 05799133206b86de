"""separate_async in the plan: vLLM's engines on their own pool (actor_rollout_ref.rollout.nnodes x
n_gpus_per_node, TP=1 each) and none of vLLM's memory on the trainer's GPUs; the engines' GPUs hold
the budget and one weight-push bucket being received. Figures by hand."""

from __future__ import annotations

import json

from megarl.config import resolve_config
from megarl.config.compose import load_config
from megarl.plan.build import GIB, MIB, ROLLOUT_POOL, TRAINER_POOL, build_plan
from megarl.plan.overhead import OWN_POOL, TRAINER_PROCESS
from megarl.plan.report import format_plan

QWEN25_7B = dict(model_type="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                 num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False)
R = "actor_rollout_ref.rollout"
BUCKET_MB = 512
# 7B, actor TP=2 over 8 GPUs, nothing offloaded, 85 % of each GPU for vLLM: too much beside the actor's
# state on a shared GPU, the natural setting on a GPU of its own.
COMMON = ("algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
          "data.train_batch_size=64", "actor_rollout_ref.actor.ppo_mini_batch_size=32", f"{R}.n=4",
          "data.max_prompt_length=512", "data.max_response_length=1536",
          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", f"{R}.log_prob_micro_batch_size_per_gpu=2",
          f"{R}.gpu_memory_utilization=0.85", f"{R}.weight_sync.bucket_size_mb={BUCKET_MB}",
          "trainer.nnodes=1", "trainer.n_gpus_per_node=8")
SEPARATE = ("trainer.use_v1=true", "trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.hybrid_engine=false",
            f"{R}.nnodes=1", f"{R}.n_gpus_per_node=4", f"{R}.tensor_model_parallel_size=1",
            f"{R}.checkpoint_engine.backend=nccl", "trainer.v1.separate_async.parameter_sync_step=2")


def _plan(tmp_path, *overrides, gib=80.0):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(QWEN25_7B))
    cfg = resolve_config(load_config([f"actor_rollout_ref.model.path={model}", *COMMON, *overrides]))
    return build_plan(cfg, gpu_memory_gib=gib, host_memory_gib=None)


def test_engines_on_their_own_pool_by_hand(tmp_path):
    plan = _plan(tmp_path, *SEPARATE)
    assert plan.rollout_pool == (1, 4)
    generate = plan.phases["generate"]
    assert generate.pool == ROLLOUT_POOL
    assert generate.terms == {"vLLM budget": int(0.85 * 80 * GIB), "weight-push bucket": BUCKET_MB * MIB,
                              "overhead": OWN_POOL}
    # the trainer's GPUs: no vLLM term in any phase; the sync there is the actor's export alone
    for name, phase in plan.phases.items():
        if name != "generate":
            assert phase.pool == TRAINER_POOL
            assert not [t for t in phase.terms if "vLLM" in t], (name, phase.terms)
    actor = plan.roles["actor"].memory
    assert plan.phases["sync"].terms == {"actor params": actor.params, "actor grads": actor.grads,
                                         "actor optimizer": actor.optimizer, "weight-sync bucket": BUCKET_MB * MIB,
                                         "overhead": TRAINER_PROCESS}  # no vLLM on these GPUs
    assert not plan.issues, [i.format() for i in plan.issues]


def test_the_same_budget_colocated_is_refused_and_separate_fits(tmp_path):
    colocated = _plan(tmp_path)
    issue = next(i for i in colocated.issues if "phase generate" in i.problem)
    assert issue.key == f"{R}.gpu_memory_utilization"
    assert colocated.phases["generate"].total > 80 * GIB
    assert not _plan(tmp_path, *SEPARATE).issues


def test_an_engine_pool_over_its_gpus_is_refused_by_its_key(tmp_path):
    plan = _plan(tmp_path, *SEPARATE, f"{R}.gpu_memory_utilization=0.99")
    assert plan.phases["generate"].total == int(0.99 * 80 * GIB) + BUCKET_MB * MIB + OWN_POOL
    (issue,) = plan.issues
    assert issue.key == f"{R}.gpu_memory_utilization" and "phase generate" in issue.problem
    assert "actor_rollout_ref.actor" not in issue.fix  # offloading the trainer's state frees nothing there


def test_report_places_no_replica_on_the_trainers_gpus(tmp_path):
    text = format_plan(_plan(tmp_path, *SEPARATE))
    assert "4 vLLM engine(s) of TP=1, one per GPU of their own pool of 1 node(s) x 4 GPU(s)" in text
    assert "rollout replica" not in text
    assert "(on the rollout pool's GPUs)" in text
