#!/usr/bin/env bash
# Issue 36's GPU runs: sync vs colocate_async vs separate_async (trainer.v1) at equal GPUs on a long-tail workload
# (benchmarks/bench_async_modes.py: 1 in 8 prompts gets --response-length tokens, the others 1/8 of it). One device
# call per step, on a machine where ../shared/gpu-stack put vLLM + Ray + megatron-core in /tmp/site and
# transformer-engine in /tmp/site-te. Logs, metrics and JSON under $OUT:
#   bash benchmarks/gpu_async.sh async1          (kind nvidia-h100-x1)
#   bash benchmarks/gpu_async.sh async2          (kind nvidia-h100-x2)
# Steps:
#   async1   one GPU: sync vs colocate_async (separate_async needs a GPU of its own for the engine)
#   async2   two GPUs: sync and colocate_async on both (actor DP=2, two vLLM replicas) vs separate_async
#            (trainer on one GPU, one standalone engine on the other)
#   async2_deep  two GPUs: colocate_async and separate_async with samples spanning up to 3 versions (2 warm-up
#            batches): a long response then has three generation phases to finish in, not two
# The policy: a random Qwen2.5-0.5B shape (benchmarks/grpo_model_dir.py /tmp/q05), the demo task's prompts,
# 64 prompts x 8 samples a step, responses of 992 (1 prompt in 8) or 124 tokens (prompt + response
# within the shape's 1,024 positions), 8 steps (medians of the last 6).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export VLLM_USE_FLASHINFER_SAMPLER=0  # vLLM 0.26 imports flashinfer for its sampler check unless this is 0; the stack has none
export PYTHONPATH=/tmp/site:/tmp/site-te:/tmp/site-fla:$PWD MEGARL_DEMO_DIR=/tmp/gpu-demo  # site-fla: scripts/prepare_fla_overlay.sh
OUT=${OUT:-$PWD/outputs}; mkdir -p "$OUT"
[ -f /tmp/q05/model.safetensors ] || python3 benchmarks/grpo_model_dir.py /tmp/q05 > "$OUT/model_q05.log" 2>&1

COMMON=(--model /tmp/q05 --data /tmp/gpu-demo/train.parquet --batch 64 --n 8 --mini-batch 16 --micro-batch 16
  --response-length 992 --steps 8 --skip 2 --timeout 540
  data.max_prompt_length=32 actor_rollout_ref.rollout.calculate_log_probs=true
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 actor_rollout_ref.rollout.gpu_memory_utilization=0.5
  actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend=auto ray_kwargs.ray_init.num_cpus=8)

for step in "$@"; do
  echo "=== $step $(date -u +%T)"
  case $step in
    async1) timeout 590 python3 benchmarks/bench_async_modes.py --gpus 1 --modes sync,colocate_async "${COMMON[@]}" \
              --work /tmp/async1 --out "$OUT/async1.json" > "$OUT/async1.log" 2>&1; echo rc $?; tail -4 "$OUT/async1.log" ;;
    async2) timeout 590 python3 benchmarks/bench_async_modes.py --gpus 2 --modes sync,colocate_async,separate_async \
              "${COMMON[@]}" --work /tmp/async2 --out "$OUT/async2.json" > "$OUT/async2.log" 2>&1; echo rc $?
            tail -5 "$OUT/async2.log" ;;
    async2_deep) timeout 590 python3 benchmarks/bench_async_modes.py --gpus 2 --modes colocate_async,separate_async \
              --off-policy 3 "${COMMON[@]}" --work /tmp/async2_deep --out "$OUT/async2_deep.json" > "$OUT/async2_deep.log" 2>&1
            echo rc $?; tail -5 "$OUT/async2_deep.log" ;;
  esac
  for mode in sync colocate_async separate_async; do  # the runs' metrics for RESULTS.md
    for dir in /tmp/async1 /tmp/async2 /tmp/async2_deep; do
      [ -f "$dir/$mode/ckpt/metrics.jsonl" ] && cp "$dir/$mode/ckpt/metrics.jsonl" "$OUT/$(basename $dir).$mode.metrics.jsonl"
    done
  done
done
