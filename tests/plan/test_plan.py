"""The plan of whole configs: placement from ParallelLayout, a 7B layout that fits and one that
is refused naming the keys, and the CLI (`python -m megarl.plan`, `main_ppo --dry-run`)."""

from __future__ import annotations

import json

import pytest

from megarl.config import resolve_config
from megarl.config.compose import load_config
from megarl.plan.__main__ import main as plan_main
from megarl.plan.build import GIB, build_plan, host_terms
from megarl.plan.overhead import TRAINER_PROCESS, VLLM_ASLEEP
from megarl.plan.placement import groups, node_lines, ranks_text
from megarl.plan.report import format_plan
from megarl.parallel.layout import ParallelLayout

QWEN25_7B = dict(model_type="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                 num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False)


def _cfg(tmp_path, *overrides, nodes=2, gpus=8):
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_7B))
    return resolve_config(load_config([
        f"actor_rollout_ref.model.path={tmp_path}", f"trainer.nnodes={nodes}", f"trainer.n_gpus_per_node={gpus}",
        "data.max_prompt_length=1024", "data.max_response_length=3072",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=2",
        *overrides]))


def test_groups_follow_megatron_order():
    layout = ParallelLayout(world_size=8, tp=2, pp=2)  # tp fastest, then dp, pp slowest
    assert groups(layout, "tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert groups(layout, "dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert groups(layout, "pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # experts: rank = etp + ETP * (ep + EP * (expert_dp + EXPERT_DP * pp)), by hand for ETP=1, EP=4, PP=2
    moe = ParallelLayout(world_size=8, tp=2, pp=2, ep=4, etp=1)
    assert groups(moe, "ep") == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_ranks_text():
    assert ranks_text([0, 1, 2, 3]) == "0-3"
    assert ranks_text(list(range(0, 509, 4))) == "0-508 step 4"
    assert ranks_text([0, 1, 2, 3, 8, 9, 10, 11]) == "0-3,8-11"
    assert ranks_text([0, 256]) == "0,256"
    assert ranks_text([5]) == "5"


def test_node_lines_join_alike_nodes():
    # 4 nodes x 2 GPUs, TP=2 PP=2 -> DP=2; rank = tp + 2 * (dp + 2 * pp): nodes 0-1 hold stage 0
    # (dp 0 then 1), nodes 2-3 stage 1; one rollout replica of TP=2 per node
    lines = node_lines(4, 2, {"actor": ParallelLayout(world_size=8, tp=2, pp=2)}, rollout_tp=2)
    assert lines == [
        "nodes 0-1 (ranks 0-3, 2 per node): actor tp0-1 pp0 cp0; rollout tp0-1; "
        "actor dp0, rollout replica 0 on node 0 .. actor dp1, rollout replica 1 on node 1",
        "nodes 2-3 (ranks 4-7, 2 per node): actor tp0-1 pp1 cp0; rollout tp0-1; "
        "actor dp0, rollout replica 2 on node 2 .. actor dp1, rollout replica 3 on node 3",
    ]


def test_placement_at_64_nodes_is_a_summary(tmp_path):
    plan = build_plan(_cfg(tmp_path, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4",
                           "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
                           "critic.megatron.tensor_model_parallel_size=4", "data.train_batch_size=1024",
                           "actor_rollout_ref.rollout.tensor_model_parallel_size=4", nodes=64, gpus=8),
                      gpu_memory_gib=80, host_memory_gib=2048)
    text = format_plan(plan)
    assert len(text.splitlines()) < 60, text
    assert "nodes 0-31 (ranks 0-255, 8 per node): actor tp0-3 pp0 cp0;" in text
    assert "nodes 32-63 (ranks 256-511, 8 per node): actor tp0-3 pp1 cp0;" in text
    assert "DP groups: 8 of 64 ranks, e.g. [0-252 step 4]" in text  # actor: TP 4 x DP 64 per stage
    assert "node 0 gpu 0" not in text


def test_7b_on_two_nodes_fits_with_tp4(tmp_path):
    plan = build_plan(_cfg(tmp_path, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4",
                           "critic.megatron.tensor_model_parallel_size=4",
                           "actor_rollout_ref.rollout.gpu_memory_utilization=0.4"), gpu_memory_gib=80, host_memory_gib=2048)
    assert not plan.issues, [i.format() for i in plan.issues]
    actor = plan.roles["actor"]
    assert (actor.layout.tp, actor.layout.dp) == (4, 4)
    assert actor.params.total == 7_615_616_512  # Qwen2.5-7B's published parameter count
    # distributed optimizer: 12 bytes/param / (TP 4 x DP 4) of the largest stage
    assert actor.memory.optimizer == pytest.approx(12 * actor.params.total / 16, rel=0.01)
    # verl's default estimator (gae) trains a critic; no KL -> no reference
    assert set(plan.phases) == {"init", "sync", "generate", "old_log_prob", "update_actor", "values", "update_critic"}
    assert plan.roles["critic"].layout.tp == 4


def test_7b_tp1_is_refused_naming_the_keys(tmp_path, capsys):
    plan = build_plan(_cfg(tmp_path, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1",
                           "actor_rollout_ref.actor.megatron.use_distributed_optimizer=false"), gpu_memory_gib=80, host_memory_gib=2048)
    text = "\n".join(i.format() for i in plan.issues)
    assert "update_actor" in text
    assert "actor_rollout_ref.actor.megatron.tensor_model_parallel_size" in text
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu" in text
    assert "actor_rollout_ref.actor.megatron.use_distributed_optimizer=true" in text
    assert "override_optimizer_config.optimizer_cpu_offload=true" in text  # Megatron's CPU optimizer
    assert plan.phases["update_actor"].total > 80 * GIB


GRPO_KL_TP2 = ("algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=true",
               "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
               "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2",
               "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
               "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
               "actor_rollout_ref.rollout.weight_sync.bucket_size_mb=512")
OFFLOAD = tuple(f"actor_rollout_ref.{role}.megatron.{k}=true" for role in ("actor", "ref")
                for k in ("param_offload", "optimizer_offload") if (role, k) != ("ref", "optimizer_offload"))


def test_phases_follow_the_offloaded_choreography(tmp_path):
    """7B at TP=2 on 2 GPUs, everything offloaded (verl's 7B Megatron scripts): each phase holds
    exactly the terms of the colocated worker's choreography (megarl/plan/build.py). Full recompute:
    rows of 4,096 tokens update at 80.1 GiB without it, the fitted overhead included."""
    plan = build_plan(_cfg(tmp_path, *GRPO_KL_TP2, *OFFLOAD, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                           "+actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full",
                           nodes=1, gpus=2), gpu_memory_gib=80, host_memory_gib=2048)
    total = 7_615_616_512  # parameters; bf16 over TP=2 -> `total` bytes per GPU
    overhead = "overhead"
    actor = plan.roles["actor"].memory
    assert actor.params == total and actor.grads == 2 * total  # fp32 main grads
    assert actor.optimizer == 6 * total  # 12 bytes per parameter / TP=2, DP=1
    p = plan.phases
    assert p["init"].terms == {"actor params": total, "actor grads": 2 * total, "actor optimizer": 6 * total,
                               overhead: TRAINER_PROCESS}  # the actor, built whole; the reference after it, offloaded
    assert p["sync"].terms == {"actor params": total, "vLLM weights": total, "weight-sync bucket": 512 * 2**20,
                               overhead: TRAINER_PROCESS + VLLM_ASLEEP}  # no gradients, optimizer state, reference or KV cache
    assert p["generate"].terms == {"vLLM budget": int(0.3 * 80 * GIB), overhead: TRAINER_PROCESS}
    assert set(p["old_log_prob"].terms) == {"actor params", "actor activations (forward)", overhead}
    assert set(p["ref_log_prob"].terms) == {"ref params", "ref activations (forward)", overhead}
    assert set(p["update_actor"].terms) == {"actor params", "actor grads", "actor optimizer",
                                            "actor activations (train)", overhead}
    assert not plan.issues, [i.format() for i in plan.issues]


def test_moe_sync_holds_two_buckets(tmp_path):
    """An MoE actor syncs through vLLM's reload_weights, whose layer loader keeps the previous bucket:
    the sync phase counts two buckets (4.29 GB measured with 2,048 MiB buckets, 30B-A3B shape, EP=4);
    a dense actor's sync counts one."""
    from test_model_size import QWEN3_30B_A3B  # tests/plan, on sys.path as every test file's folder

    moe_dir, dense_dir = tmp_path / "moe", tmp_path / "dense"
    for d, shape in ((moe_dir, QWEN3_30B_A3B), (dense_dir, QWEN25_7B)):
        d.mkdir()
        (d / "config.json").write_text(json.dumps(shape))
    layout = ("actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4",
              "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=4",
              "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
              "actor_rollout_ref.rollout.weight_sync.bucket_size_mb=2048")
    moe = ("actor_rollout_ref.actor.megatron.expert_model_parallel_size=4",
           "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1")  # the reference mirrors both

    def sync_terms(model_dir, *extra):
        cfg = resolve_config(load_config([f"actor_rollout_ref.model.path={model_dir}", "trainer.nnodes=1",
                                          "trainer.n_gpus_per_node=4", *layout, *extra]))
        return build_plan(cfg, gpu_memory_gib=140, host_memory_gib=2048).phases["sync"].terms

    assert sync_terms(moe_dir, *moe)["weight-sync buckets (2: vLLM's reload)"] == 2 * 2048 * 2**20
    dense = sync_terms(dense_dir)
    assert dense["weight-sync bucket"] == 2048 * 2**20 and not any("buckets" in k for k in dense)


def test_phases_without_offload_keep_every_role_resident(tmp_path):
    plan = build_plan(_cfg(tmp_path, *GRPO_KL_TP2, nodes=1, gpus=2), gpu_memory_gib=80, host_memory_gib=2048)
    total = 7_615_616_512
    resident = {"actor params": total, "actor grads": 2 * total, "actor optimizer": 6 * total, "ref params": total}
    gen = plan.phases["generate"].terms
    assert {k: gen[k] for k in resident} == resident and gen["vLLM budget"] == int(0.3 * 80 * GIB)
    sync = plan.phases["sync"].terms
    assert {k: sync[k] for k in resident} == resident and sync["vLLM weights"] == total
    # init: the critic-free build order is actor then reference; nothing offloaded: both whole
    assert set(plan.phases["init"].terms) == {*resident, "overhead"}
    # 9 x 7.1 + 0.3 x 80 + 2 GiB > 80 GiB: generate and sync are refused, naming the offload keys
    text = "\n".join(i.format() for i in plan.issues)
    assert "phase generate" in text and "actor_rollout_ref.actor.megatron.param_offload" in text
    assert "phase sync" in text and "actor_rollout_ref.rollout.weight_sync.bucket_size_mb" in text


def test_grad_offload_keeps_the_gradients_alone_on_the_host(tmp_path):
    """verl <= 0.8's megatron.grad_offload: the actor's fp32 gradients (2 bytes per parameter per
    GPU at TP=2) leave the GPU between phases; its parameters and optimizer state stay."""
    total = 7_615_616_512
    plan = build_plan(_cfg(tmp_path, *GRPO_KL_TP2, "actor_rollout_ref.actor.megatron.grad_offload=true", nodes=1, gpus=2),
                      gpu_memory_gib=80, host_memory_gib=2048)
    gen = plan.phases["generate"].terms
    assert "actor grads" not in gen and gen["actor params"] == total and gen["actor optimizer"] == 6 * total
    assert plan.roles["actor"].offloaded == 2 * total
    assert "actor grads" in plan.phases["update_actor"].terms


def _cpu_optimizer(fraction: float) -> tuple[str, ...]:
    """verl's keys for Megatron's CPU optimizer (its MoE scripts)."""
    o = "actor_rollout_ref.actor.optim.override_optimizer_config"
    return (f"+{o}.optimizer_cpu_offload=true", f"+{o}.optimizer_offload_fraction={fraction}",
            f"+{o}.overlap_cpu_optimizer_d2h_h2d=true", f"+{o}.use_precision_aware_optimizer=true")


def test_cpu_optimizer_state_is_in_host_memory_for_good(tmp_path):
    """7B at TP=2 on 2 GPUs, offloaded as verl's scripts, Megatron's CPU optimizer at fraction 0.5: per GPU
    3.8B parameters -> 16 bytes x half of them on the host for the run, 12 x the other half on the GPU
    (which optimizer_offload moves between phases); at fraction 1 no optimizer state on the GPU at all."""
    total = 7_615_616_512  # parameters; bf16 over TP=2 -> `total` bytes per GPU
    half = build_plan(_cfg(tmp_path, *GRPO_KL_TP2, *OFFLOAD, *_cpu_optimizer(0.5), nodes=1, gpus=2),
                      gpu_memory_gib=80, host_memory_gib=2048)
    actor = half.roles["actor"].memory
    assert (actor.optimizer, actor.optimizer_host, actor.grads) == (3 * total, 4 * total, 2 * total)
    assert half.phases["update_actor"].terms["actor optimizer"] == 3 * total
    copies = total + 2 * total + 3 * total + total  # actor params, grads, optimizer (GPU part); ref params
    assert host_terms(half) == {f"offload copies (2 GPUs x {copies / GIB:.1f})": 2 * copies,
                                f"CPU optimizer (2 GPUs x {4 * total / GIB:.1f})": 2 * 4 * total,
                                "worker processes (2 x 20)": 2 * 20 * GIB}
    whole = build_plan(_cfg(tmp_path, *GRPO_KL_TP2, *OFFLOAD, *_cpu_optimizer(1), nodes=1, gpus=2),
                       gpu_memory_gib=80, host_memory_gib=2048)
    assert whole.roles["actor"].memory.optimizer_host == 8 * total
    assert "actor optimizer" not in whole.phases["update_actor"].terms and "actor optimizer" not in whole.phases["init"].terms
    small = build_plan(_cfg(tmp_path, *GRPO_KL_TP2, *OFFLOAD, *_cpu_optimizer(1), nodes=1, gpus=2),
                       gpu_memory_gib=80, host_memory_gib=100)
    issue = next(i for i in small.issues if i.key == "trainer.memory_plan.host_memory_gib")
    assert "the CPU optimizer's state" in issue.problem
    assert "override_optimizer_config.optimizer_offload_fraction" in issue.fix
    assert "actor_rollout_ref.actor.megatron.optimizer_offload" not in issue.fix  # it moves nothing at fraction 1


def test_vllm_budget_without_room_for_kv_is_refused(tmp_path):
    plan = build_plan(_cfg(tmp_path, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4",
                           "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                           "actor_rollout_ref.rollout.gpu_memory_utilization=0.18"), gpu_memory_gib=80, host_memory_gib=2048)
    # 0.18 x 80 = 14.4 GiB < 14.2 GiB of 7B bf16 weights + one 4096-token sequence of KV
    assert any(i.key == "actor_rollout_ref.rollout.gpu_memory_utilization" and "KV cache" in i.problem
               for i in plan.issues)


def test_main_ppo_dry_run_prints_the_plan():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "megarl.main_ppo", "--config-name=ppo_megatron_trainer", "--dry-run",
                           "trainer.total_training_steps=2"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "megarl plan: 1 node(s) x 1 GPU(s)" in done.stdout
    assert "step" not in done.stdout.lower().split("megarl plan")[1]  # nothing ran


def test_cli_prints_demo_plan_and_refuses_a_tiny_gpu(capsys):
    assert plan_main(["--config-name=ppo_megatron_trainer", "trainer.total_training_steps=2"]) == 0
    out = capsys.readouterr().out
    assert "node 0 gpu 0 (rank 0): actor dp0 tp0 pp0 cp0; rollout replica 0 tp0 (head)" in out
    assert "fits:" in out
    assert plan_main(["--gpu-memory-gib=0.004", "trainer.total_training_steps=2"]) == 2
    out = capsys.readouterr().out
    assert "REFUSED" in out and "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu" in out


def test_host_memory_holds_the_offload_copies(tmp_path):
    """Every offloaded byte has a page-locked host copy per GPU: a node that cannot hold its GPUs'
    copies is refused naming the offload keys (the 7B TP=2 run of 2026-11-26 with everything
    offloaded ran its node out of RAM at the first update); with the RAM unknown it is reported only."""
    cfg = _cfg(tmp_path, *GRPO_KL_TP2, *OFFLOAD, nodes=1, gpus=2)
    total = 7_615_616_512  # bf16 bytes per GPU at TP=2
    # actor: params + fp32 grads + Adam (12 B/param at TP=2) = 1 + 2 + 6 totals; reference: its params
    per_gpu = (1 + 2 + 6) * total + total
    small = build_plan(cfg, gpu_memory_gib=80, host_memory_gib=100)
    issue = next(i for i in small.issues if i.key == "trainer.memory_plan.host_memory_gib")
    need = 2 * per_gpu + 2 * 20 * GIB
    assert f"needs {need / GIB:.1f} GiB of host memory" in issue.problem
    assert "actor_rollout_ref.actor.megatron.optimizer_offload" in issue.fix and "trainer.n_gpus_per_node" in issue.fix
    host_key = "trainer.memory_plan.host_memory_gib"
    assert all(i.key != host_key for i in build_plan(cfg, gpu_memory_gib=80, host_memory_gib=251).issues)
    unknown = build_plan(cfg, gpu_memory_gib=80, host_memory_gib=None)
    assert all(i.key != host_key for i in unknown.issues) and "not judged" in format_plan(unknown)


def test_the_actor_forward_counts_the_entropy(tmp_path):
    """The actor's old-log-prob pass also takes the entropy: 12 bytes per logit (measured 12.4 at
    7B), the reference's 6."""
    plan = build_plan(_cfg(tmp_path, *GRPO_KL_TP2, nodes=1, gpus=2), gpu_memory_gib=80, host_memory_gib=None)
    actor, ref = plan.roles["actor"].memory, plan.roles["ref"].memory
    logits = 4 * 4096 * 152064 / 2  # log_prob micro-batch 4 x 4096 tokens, vocabulary / TP
    assert actor.activations_forward - ref.activations_forward == pytest.approx(6 * logits, rel=1e-6)


def test_bypass_mode_has_no_old_log_prob_phase(tmp_path):
    """algorithm.rollout_correction.bypass_mode: the rollout's log-probs are the old policy, the trainer runs no
    actor forward pass (megarl.trainer.ppo_trainer), so the plan has no old_log_prob phase; the reference's stays."""
    default = build_plan(_cfg(tmp_path, *GRPO_KL_TP2, nodes=1, gpus=2), gpu_memory_gib=80, host_memory_gib=None)
    bypass = build_plan(_cfg(tmp_path, *GRPO_KL_TP2, "algorithm.rollout_correction.bypass_mode=true",
                             "actor_rollout_ref.rollout.calculate_log_probs=true", nodes=1, gpus=2),
                        gpu_memory_gib=80, host_memory_gib=None)
    assert "old_log_prob" in default.phases and "old_log_prob" not in bypass.phases
    assert set(default.phases) - set(bypass.phases) == {"old_log_prob"}
