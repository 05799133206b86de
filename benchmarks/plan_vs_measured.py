"""The plan's memory estimates (megarl.plan) beside the peaks measured on the GPU machine.

    python benchmarks/plan_vs_measured.py

The measured peaks (torch's max_memory_allocated per GPU, from the GPU sessions of
benchmarks/RESULTS.md) are below; prints, per run, the estimate of megarl.plan.memory for the same
shape, layout and micro-batch, and the error. No GPU needed.
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
from _common import QWEN25_1P5B, QWEN25_7B  # noqa: E402

GIB = 2**30
# GRPO e2e 0.5B (gpu_session.sh e2e_sdpa, H100, session 6): memory/<phase>_peak_gib of steps 2 and 3
E2E_PEAKS_GIB = ({"step": 2, "rollout": 29.270, "old_log_prob": 29.340, "update_actor": 32.809},
                 {"step": 3, "rollout": 29.271, "old_log_prob": 29.340, "update_actor": 32.810})


def actor_rows() -> list[tuple[str, float, float]]:
    """(run, estimate GiB, measured GiB) of the actor-update benchmarks (bench_actor_throughput.py:
    megatron DDP + distributed optimizer, bf16, fp32 grads, full-length rows, no SP)."""
    q15 = {**QWEN25_1P5B, "model_type": "qwen2"}
    q7_8 = {**QWEN25_7B, "model_type": "qwen2", "num_hidden_layers": 8}
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
    contexts and NCCL buffers, the plan's GPU_OVERHEAD, are outside it and left out here)."""
    from megarl.config import resolve_config
    from megarl.config.compose import load_config
    from megarl.plan.build import GPU_OVERHEAD, build_plan

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
        estimate = (plan.phases[phase].total - GPU_OVERHEAD + (vllm if plus_vllm else 0)) / GIB
        label = f"GRPO e2e 0.5B (SDPA, padded), {phase}" + (" + vLLM's sleeping pool" if plus_vllm else "")
        rows += [(f"{label}, step {s['step']}", estimate, m) for s, m in zip(steps, measured)]
    return rows


def main() -> None:
    print(f"| run | plan estimate GiB | measured peak GiB | estimate vs measured |")
    print("|---|---|---|---|")
    for name, est, meas in actor_rows() + e2e_rows():
        print(f"| {name} | {est:.1f} | {meas:.1f} | {100 * (est / meas - 1):+.1f} % |")


if __name__ == "__main__":
    main()
