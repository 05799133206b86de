"""Device memory outside the plan's terms, per GPU and phase: fitted to the GPU runs' device in use.

The fit (benchmarks/RESULTS.md; each point is the device's memory in use, nvidia-smi's figure, less
the plan's terms for the same run; the table and the check: benchmarks/plan_vs_measured.py,
tests/plan/test_overhead.py):

* ``generate`` (vLLM awake), dense 7B: 4.9 (TP=2, 2 x H100, 2026-11-26, vLLM 0.20), 5.3 (TP=2, 2 x H200,
  2026-11-27 morning), 5.8 (TP=2 x DP=2) and 4.6 GiB (TP=4, 4 x H200, 2026-11-26/27 night);
  Qwen3-30B-A3B shape at TP=4 x EP=4: 6.0-7.6 GiB (4 x H200, 2026-11-27 morning and second stay).
* vLLM asleep (``sync``: vLLM's weights woken, its KV cache not): dense 5.1-6.5 GiB; the MoE at EP=4
  9.2-9.9 GiB, and 8.1-9.3 GiB with every model offloaded.

vLLM (0.26, as 0.21 on) counts inside its ``gpu_memory_utilization`` budget what it allocates after
its start-up memory snapshot: weights, the profiled activation peak, the non-torch memory that grew
meanwhile, its CUDA graphs (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``, on by default) and the KV
cache (vllm/v1/worker/gpu_worker.py ``determine_available_memory``). The snapshot is taken after its
NCCL groups are built, in the process megarl already runs, so the CUDA context and every communicator
are outside the budget: the plan adds them here, not to the budget. Sleep releases only the weights and
the KV cache; the rest of the budget (the CUDA-graph pool, vLLM's workspaces) stays on the GPU in every
other phase.
"""

from __future__ import annotations

GIB = 2**30
# Every GPU of the trainer, every phase: the worker process's CUDA context and loaded kernels, cuBLAS
# workspaces, the NCCL communicators of Megatron's groups, vLLM's and megarl's (outside vLLM's budget,
# see above), the caching allocator's free blocks. Dense 7B at generate: 4.6-5.8 GiB (TP=2, TP=2 x DP=2,
# TP=4). How it splits between these parts was not measured.
TRAINER_PROCESS = int(5.5 * GIB)
# With expert parallelism (the actor's EP > 1): the expert-parallel and expert-data-parallel groups'
# communicators and vLLM's EP group. The 30B-A3B shape at EP=4, generate: 6.0-7.6 GiB in all.
EXPERT_PARALLEL = int(1.5 * GIB)
# What vLLM's budget keeps on the GPU while it sleeps (its CUDA-graph pool, workspaces), in every phase
# after vLLM started but generate: dense 7B sync 5.1-6.5 GiB in all.
VLLM_ASLEEP = GIB // 2
# The same with expert parallelism (MoE layers' graphs and workspaces): 30B-A3B at EP=4, sync 9.2-9.9,
# everything offloaded 8.1-9.3 GiB in all.
VLLM_ASLEEP_EXPERT_PARALLEL = int(1.5 * GIB)
# A further process on a trainer GPU (the critic's, the reward model's, a colocated teacher's): its CUDA
# context and cuBLAS workspace (~0.5 GiB on H100, CUDA 13). Not measured beside the fit above.
CUDA_CONTEXT = GIB // 2
# A GPU of its own pool (separate_async's vLLM engines, the teacher with distillation.nnodes > 0): one
# process, no colocated trainer. Not measured; the estimate made before the GPU runs.
OWN_POOL = 2 * GIB


def trainer_overhead(*, expert_parallel: bool, vllm_asleep: bool, further_processes: int) -> dict[str, int]:
    """The overhead of one trainer GPU by part (zero parts left out), bytes. ``expert_parallel``: the
    actor's EP > 1; ``vllm_asleep``: a phase after vLLM started, other than generate, with vLLM asleep;
    ``further_processes``: processes on the GPU besides the actor/rollout/reference worker."""
    parts = {"worker process": TRAINER_PROCESS,
             "expert-parallel groups": EXPERT_PARALLEL if expert_parallel else 0,
             "vLLM asleep": (VLLM_ASLEEP + (VLLM_ASLEEP_EXPERT_PARALLEL if expert_parallel else 0)) if vllm_asleep else 0,
             "further processes": CUDA_CONTEXT * further_processes}
    return {part: size for part, size in parts.items() if size}
