"""The plan's memory estimates (megarl.plan) beside the peaks measured on the GPU machine.

    python benchmarks/plan_vs_measured.py

The measured peaks (torch's max_memory_allocated per GPU, from the GPU sessions of
benchmarks/RESULTS.md) are below; prints, per run, the estimate of megarl.plan.memory for the same
shape, layout and micro-batch, and the error. Then the device's memory in use (nvidia-smi's figure)
of the multi-GPU runs beside the plan's phase with its overhead (megarl/plan/overhead.py, fitted to
them; tests/plan/test_overhead.py holds it within 1 GiB of each). No GPU needed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from megarl.parallel.layout import ParallelLayout
from megarl.plan.memory import TrainSetup, rank_memory
from megarl.plan.model_size import ModelShape, count_params

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import QWEN25_1P5B  # noqa: E402
from _common import QWEN25_7B as _QWEN25_7B  # noqa: E402

QWEN25_7B = {**_QWEN25_7B, "model_type": "qwen2"}

GIB = 2**30
# GRPO e2e 0.5B (gpu_session.sh e2e_sdpa, H100, session 6): memory/<phase>_peak_gib of steps 2 and 3
E2E_PEAKS_GIB = ({"step": 2, "rollout": 29.270, "old_log_prob": 29.340, "update_actor": 32.809},
                 {"step": 3, "rollout": 29.271, "old_log_prob": 29.340, "update_actor": 32.810})


def actor_rows() -> list[tuple[str, float, float]]:
    """(run, estimate GiB, measured GiB) of the actor-update benchmarks (bench_actor_throughput.py:
    megatron DDP + distributed optimizer, bf16, fp32 grads, full-length rows, no SP)."""
    q15 = {**QWEN25_1P5B, "model_type": "qwen2"}
    q7_8 = {**QWEN25_7B, "num_hidden_layers": 8}
    cases = [  # (run, shape, TP, tokens per micro-batch, measured peak GiB; sessions 4-6 of RESULTS.md)
        ("1.5B TP=1 seq 4096 micro-bs 2, SDPA, padded (H100)", q15, 1, 2 * 4096, 49.500),
        ("1.5B TP=1 seq 4096 micro-bs 2, TE, padded (H100)", q15, 1, 2 * 4096, 48.765),
        ("1.5B TP=1 seq 4096 micro-bs 2, SDPA, packed (H100)", q15, 1, 2 * 4096, 49.962),
        ("1.5B TP=2 seq 4096 micro-bs 4 (2 x H200)", q15, 2, 4 * 4096, 39.219),
        ("1.5B TP=2 seq 4096 micro-bs 4, packed (2 x H200)", q15, 2, 4 * 4096, 52.823),
        ("7B shape, 8 layers, TP=1 seq 4096 micro-bs 1, TE bf16 (H100)", q7_8, 1, 4096, 58.076),
        ("7B shape, 8 layers, TP=1 seq 4096 micro-bs 1, TE FP8 (H100)", q7_8, 1, 4096, 60.860),
    ]
    rows = []
    for name, shape, tp, tokens, measured in cases:
        params = count_params(ModelShape.from_hf_config(shape))
        m = rank_memory(params, ParallelLayout(world_size=tp, tp=tp),
                        TrainSetup(dtype="bfloat16", trainable=True, tokens=tokens, forward_tokens=tokens))
        rows.append((name, (m.resident + m.activations_train) / GIB, measured))
    return rows


def e2e_rows() -> list[tuple[str, float, float]]:
    """GRPO end to end (gpu_session.sh e2e_sdpa): the plan of the same overrides; the measured
    peaks are `memory/*_peak_gib` of steps 2-3 (torch's counter, vLLM's pool included; CUDA
    contexts and NCCL buffers, the plan's overhead term, are outside it and left out here)."""
    from megarl.config import resolve_config
    from megarl.config.compose import load_config
    from megarl.plan.build import build_plan

    with tempfile.TemporaryDirectory() as model_dir:
        env = {**os.environ, "MEGARL_DEMO_DIR": os.environ.get("MEGARL_DEMO_DIR", tempfile.gettempdir() + "/megarl-demo")}
        subprocess.run([sys.executable, str(HERE / "grpo_model_dir.py"), model_dir, "--config-only"], check=True,
                       env=env, capture_output=True)
        cfg = resolve_config(load_config([
            f"actor_rollout_ref.model.path={model_dir}", "trainer.device=cuda", "trainer.n_gpus_per_node=1",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "data.train_batch_size=64",
            "data.max_prompt_length=32", "data.max_response_length=224", "actor_rollout_ref.rollout.n=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=64", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16", "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.actor.megatron.sequence_parallel=false", "actor_rollout_ref.rollout.gpu_memory_utilization=0.3"]))
        plan = build_plan(cfg, gpu_memory_gib=79.19, host_memory_gib=2048)  # an H100 80GB: 79.19 GiB total
    steps = E2E_PEAKS_GIB
    vllm = plan.vllm.budget
    rows = []
    for phase, key, plus_vllm in (("generate", "rollout", False), ("old_log_prob", "old_log_prob", True),
                                  ("update_actor", "update_actor", True)):
        measured = [s[key] for s in steps]
        p = plan.phases[phase]
        estimate = (p.total - p.terms["overhead"] + (vllm if plus_vllm else 0)) / GIB
        label = f"GRPO e2e 0.5B (SDPA, padded), {phase}" + (" + vLLM's sleeping pool" if plus_vllm else "")
        rows += [(f"{label}, step {s['step']}", estimate, m) for s, m in zip(steps, measured)]
    return rows


# The multi-GPU runs' device memory in use (memory/sync_*_device_used_gib, memory/rollout_*; GiB per GPU), from
# benchmarks/RESULTS.md, with the overrides of their benchmarks/gpu_scale.sh steps (the run's model, GPU count,
# data and offload keys; the rest at the defaults the runs had). "sync": vLLM's weights woken, its KV cache not;
# "generate": the KV cache woken too; "offloaded": every model offloaded, vLLM asleep (the overhead alone).
H100, H200 = 79.1, 139.8  # torch's total memory of the cards, GiB
QWEN3_30B_A3B_24 = dict(model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                        moe_intermediate_size=768, num_hidden_layers=24, num_attention_heads=32, num_key_value_heads=4,
                        head_dim=128, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1,
                        mlp_only_layers=[], tie_word_embeddings=False, max_position_embeddings=40960)
_R = "actor_rollout_ref"
SCALE7B = [f"{_R}.actor.megatron.tensor_model_parallel_size=2", f"{_R}.rollout.tensor_model_parallel_size=2",
           "data.train_batch_size=16", "data.max_prompt_length=64", "data.max_response_length=1024", f"{_R}.rollout.n=8",
           f"{_R}.actor.ppo_mini_batch_size=16", f"{_R}.actor.ppo_micro_batch_size_per_gpu=2",
           f"{_R}.rollout.log_prob_micro_batch_size_per_gpu=16", f"{_R}.ref.log_prob_micro_batch_size_per_gpu=16",
           f"{_R}.actor.megatron.optimizer_offload=true", f"{_R}.ref.megatron.param_offload=true",
           f"{_R}.actor.use_kl_loss=true"]
OFFLOADED = [f"{_R}.actor.megatron.param_offload=true", f"{_R}.rollout.gpu_memory_utilization=0.5"]
DP2 = ["data.train_batch_size=32", f"{_R}.actor.ppo_mini_batch_size=32"]
TP4 = [f"{_R}.actor.megatron.tensor_model_parallel_size=4", f"{_R}.rollout.tensor_model_parallel_size=4"]
MOE30B = [f"{_R}.actor.megatron.tensor_model_parallel_size=4", f"{_R}.actor.megatron.expert_model_parallel_size=4",
          f"{_R}.actor.megatron.expert_tensor_parallel_size=1", f"{_R}.rollout.tensor_model_parallel_size=4",
          f"{_R}.rollout.expert_parallel_size=4", *SCALE7B[2:], *OFFLOADED]
# (run, shape, GPUs, card GiB, overrides, phase, measured GiB, plan terms the run did not hold: the dense runs
# synced shard to shard, with no bucket, `peak_extra_bytes` 0)
DEVICE_IN_USE = [
    ("7B TP=2, optimizer offloaded, 2 x H100, 2026-11-26 (vLLM 0.20)", QWEN25_7B, 2, H100,
     [*SCALE7B, f"{_R}.rollout.gpu_memory_utilization=0.45"], "generate", (61.8,), ()),
    ("7B TP=2, optimizer offloaded, 2 x H100, 2026-11-26 (vLLM 0.20)", QWEN25_7B, 2, H100,
     [*SCALE7B, f"{_R}.rollout.gpu_memory_utilization=0.45"], "sync", (34.9,), ("weight-sync bucket",)),
    ("7B TP=2, all offloaded, 2 x H200, 2026-11-27 morning", QWEN25_7B, 2, H200, [*SCALE7B, *OFFLOADED],
     "generate", (75.2,), ()),
    ("7B TP=2, all offloaded, 2 x H200, 2026-11-27 morning", QWEN25_7B, 2, H200, [*SCALE7B, *OFFLOADED],
     "sync", (20.1,), ("weight-sync bucket",)),
    ("7B TP=2 x DP=2, all offloaded, 4 x H200, 2026-11-26/27 night", QWEN25_7B, 4, H200, [*SCALE7B, *OFFLOADED, *DP2],
     "generate", (75.7,), ()),
    ("7B TP=2 x DP=2, all offloaded, 4 x H200, 2026-11-26/27 night", QWEN25_7B, 4, H200, [*SCALE7B, *OFFLOADED, *DP2],
     "sync", (20.7,), ("weight-sync bucket",)),
    ("7B TP=4, all offloaded, 4 x H200, 2026-11-26/27 night", QWEN25_7B, 4, H200, [*SCALE7B, *OFFLOADED, *DP2, *TP4],
     "generate", (74.5,), ()),
    ("7B TP=4, all offloaded, 4 x H200, 2026-11-26/27 night", QWEN25_7B, 4, H200, [*SCALE7B, *OFFLOADED, *DP2, *TP4],
     "sync", (12.2,), ("weight-sync bucket",)),
    ("30B-A3B (24 layers) TP=4 x EP=4, R3, 4 x H200, 2026-11-27 morning, steps 2 / 3", QWEN3_30B_A3B_24, 4, H200,
     MOE30B, "generate", (77.0, 75.9), ()),
    ("30B-A3B (24 layers) TP=4 x EP=4, R3, 4 x H200, 2026-11-27 morning, steps 2 / 3", QWEN3_30B_A3B_24, 4, H200,
     MOE30B, "sync", (28.4, 27.7), ()),
    ("30B-A3B (24 layers) TP=4 x EP=4, R3, 4 x H200, 2026-11-27 morning", QWEN3_30B_A3B_24, 4, H200,
     MOE30B, "offloaded", (8.1, 9.3), ()),
    ("30B-A3B (24 layers) TP=4 x EP=4, 4 x H200, 2026-11-27 second stay", QWEN3_30B_A3B_24, 4, H200,
     MOE30B, "generate", (76.5, 77.5), ()),
]


def device_rows() -> list[tuple[str, float, float]]:
    """(run and phase, plan GiB, measured GiB) of DEVICE_IN_USE: the plan's phase total less the terms
    the run did not hold; "offloaded": the overhead of a phase with vLLM asleep (old_log_prob's)."""
    import json

    from megarl.config import resolve_config
    from megarl.config.compose import load_config
    from megarl.plan.build import build_plan

    rows = []
    with tempfile.TemporaryDirectory() as model_dir:
        for run, shape, gpus, card, overrides, phase, measured, absent in DEVICE_IN_USE:
            (Path(model_dir) / "config.json").write_text(json.dumps(shape))
            cfg = resolve_config(load_config([f"actor_rollout_ref.model.path={model_dir}", "trainer.device=cuda",
                                              f"trainer.n_gpus_per_node={gpus}", "algorithm.adv_estimator=grpo",
                                              *overrides]))
            plan = build_plan(cfg, gpu_memory_gib=card, host_memory_gib=None)
            if phase == "offloaded":
                estimate = plan.phases["old_log_prob"].terms["overhead"]
            else:
                terms = plan.phases[phase].terms
                estimate = sum(size for term, size in terms.items() if term not in absent)
            rows += [(f"{run}, {phase}", estimate / GIB, m) for m in measured]
    return rows


def main() -> None:
    print(f"| run | plan estimate GiB | measured peak GiB | estimate vs measured |")
    print("|---|---|---|---|")
    for name, est, meas in actor_rows() + e2e_rows():
        print(f"| {name} | {est:.1f} | {meas:.1f} | {100 * (est / meas - 1):+.1f} % |")
    print()
    print("| run, phase (device in use) | plan GiB | measured GiB | plan - measured GiB |")
    print("|---|---|---|---|")
    for name, est, meas in device_rows():
        print(f"| {name} | {est:.1f} | {meas:.1f} | {est - meas:+.1f} |")


if __name__ == "__main__":
    main()
