#!/usr/bin/env bash
# Issue 36's GPU runs: sync vs colocate_async vs separate_async (trainer.v1) at equal GPUs on a long-tail workload
# (benchmarks/bench_async_modes.py: 1 in 8 prompts gets --response-length tokens, the others 1/8 of it), on a machine where ../shared/gpu-stack put vLLM + Ray + megatron-core in /tmp/site and
# transformer-engine in /tmp/site-te. Logs, metrics and JSON under $OUT:
#   bash benchmarks/gpu_async.sh async1          (kind nvidia-h100-x1)
#   bash benchmarks/gpu_async.sh async2          (kind nvidia-h100-x2)
# Steps:
#   async1   one GPU: sync vs colocate_async (separate_async needs a GPU of its own for the engine)
#   async2   two GPUs: sync and colocate_async on both (actor DP=2, two vLLM replicas) vs separate_async
#            (trainer on one GPU, one standalone engine on the other)
#   async4   four GPUs: sync and colocate_async (actor DP=4, four vLLM replicas) vs separate_async on 2 + 2
#            (trainer DP=2, two standalone engines), threshold 3 for the async modes (issue 36's 4-GPU figures)
#   async2_sync  two GPUs: sync alone (the same-run baseline of async2_deep, on the other two GPUs of a 4-GPU machine)
#   async2_deep  two GPUs: colocate_async and separate_async with samples spanning up to 3 versions (2 warm-up
#            batches): a long response then has three generation phases to finish in, not two
#   async2_sync_bypass, async2_sep_bypass  async2_sync and separate_async (threshold 3) with
#            algorithm.rollout_correction.bypass_mode=true (the rollout's log-probs as the old policy: no old-log-prob
#            pass on the trainer, whose own work is separate_async's step), side by side on a 4-GPU machine
#   async7b  two GPUs: sync vs colocate_async at 7B (/tmp/q7b: gpu_scale.sh model7b first), actor and one vLLM
#            replica at TP=2, optimizer state offloaded (e2e7b_tp2_optim's memory), 16 prompts x 8, long responses
#            1,024 tokens, 6 steps. At 0.5B generation is bound by vLLM's cost per sampled token, which overlap
#            cannot remove; at 7B each decode step's fixed cost (reading the weights) is the larger part, and that is
#            what colocate_async's shorter generation phases save (RESULTS.md, eighth session's analysis)
#   async7b_r2  two GPUs at 7B: async7b with two TP=1 vLLM replicas (one a GPU) instead of one TP=2: the replica
#            balance and the common phase end of the tenth session at size, on 2 GPUs
#   async7b_dyn  async7b_r2 with dynamic batches (16k tokens a micro-batch) and the optimizer state on the GPUs: the
#            update at verl's settings, so that it no longer bounds the async gain (issue 36's 1.5x on 2 GPUs)
#   async2_colo  async2 without separate_async: sync vs colocate_async on two 0.5B replicas (the replica fixes)
#   async7b4, async7b4_sep  four GPUs at 7B with async7b_dyn's update: sync and colocate_async (two TP=2 replicas),
#            then separate_async with the trainer on 2 GPUs and two TP=1 engines on the other 2 (run them one after
#            the other; compare the two JSON files). Planned at 97.0 and 110.2 of 139.8 GiB
# The policy: a random Qwen2.5-0.5B shape (benchmarks/grpo_model_dir.py /tmp/q05), the demo task's prompts,
# 64 prompts x 8 samples a step, responses of 992 (1 prompt in 8) or 124 tokens (prompt + response
# within the shape's 1,024 positions), 8 steps (medians of the last 6).
# Each mode is a fresh main_ppo (its own Ray, Megatron build and vLLM start-up with CUDA-graph capture), so a mode
# costs its ~80 s of steps plus start-up and shutdown: the three modes of async2 did not fit one 590 s limit (all 8
# steps of each mode ran, then the limit killed it before it printed anything). Each mode is now a call of its own (limit 590 s, main_ppo 520 s
# then SIGTERM), its row printed and added to NAME.json as it ends; a step takes 2-3 such limits, so run it through
# benchmarks/gpu_queue.sh, not in one device call. run.log lines carry the seconds since launch (where start-up
# goes). A killed run's table from the copied metrics:
#   python3 benchmarks/bench_async_modes.py --gpus 2 --batch 64 --n 8 --skip 2 --from-metrics sync=$OUT/async2.sync.metrics.jsonl ...
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export VLLM_USE_FLASHINFER_SAMPLER=0  # vLLM 0.26 imports flashinfer for its sampler check unless this is 0; the stack has none
export PYTHONPATH=/tmp/site:/tmp/site-te:/tmp/site-fla:$PWD MEGARL_DEMO_DIR=/tmp/gpu-demo  # site-fla: scripts/prepare_fla_overlay.sh
OUT=${OUT:-$PWD/outputs}; mkdir -p "$OUT"
[ -f /tmp/q05/model.safetensors ] || python3 benchmarks/grpo_model_dir.py /tmp/q05 > "$OUT/model_q05.log" 2>&1

COMMON=(--model /tmp/q05 --data /tmp/gpu-demo/train.parquet --batch 64 --n 8 --mini-batch 16 --micro-batch 16
  --response-length 992 --steps 8 --skip 2 --timeout 520
  data.max_prompt_length=32 actor_rollout_ref.rollout.calculate_log_probs=true
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 actor_rollout_ref.rollout.gpu_memory_utilization=0.5
  actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend=auto ray_kwargs.ray_init.num_cpus=8)

# 7B (/tmp/q7b: gpu_scale.sh model7b first): the trainer at TP=2, 1,024-token long responses, 6 steps; the colocated
# modes with one vLLM TP=2 replica per 2 GPUs and the optimizer state offloaded (vLLM shares the GPU), separate_async
# with TP=1 engines on GPUs of their own (bench_async_modes.py sets that) and the optimizer state on the GPU
ASYNC7B=(--off-policy 3 --model /tmp/q7b --micro-batch 2 --response-length 1024 --steps 6 --skip 2
  actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 actor_rollout_ref.rollout.gpu_memory_utilization=0.45
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16)
COLOCATED7B=(actor_rollout_ref.rollout.tensor_model_parallel_size=2 actor_rollout_ref.actor.megatron.optimizer_offload=true)

# The 7B update with verl's dynamic batches (its 7B scripts set them) and the optimizer state on the GPU: async7b's
# fixed 2-sequence micro-batches made the update ~70 % of the step (17 s for ~39k tokens on 2 H200s), which bounds
# what any overlap of generation can gain. vLLM at 0.35 so that the woken engine fits beside the optimizer state
# (plan: 118.3 of 139.8 GiB, generate phase)
# 9 steps, the window the last 6: two whole cycles of threshold 3 (async7b_dyn's 6 steps held one, 1.52x)
DYN7B=(--steps 9 --skip 3 actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384
  actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=32768
  actor_rollout_ref.rollout.gpu_memory_utilization=0.35)

modes() {  # modes NAME GPUS MODES [args...]: one bench_async_modes.py call per mode, each under its own 590 s, into one
  # $OUT/NAME.json (each call adds its mode) and NAME.log (each mode's summary row as it ends); the metrics beside them
  local name=$1 gpus=$2 mode; shift 2; local list=$1; shift
  rm -f "$OUT/$name.json" "$OUT/$name.log"
  for mode in ${list//,/ }; do
    echo "--- $mode $(date -u +%T)" >> "$OUT/$name.log"
    timeout 590 python3 benchmarks/bench_async_modes.py --gpus "$gpus" --modes "$mode" "${COMMON[@]}" "$@" \
      --work "/tmp/$name" --out "$OUT/$name.json" >> "$OUT/$name.log" 2>&1; echo "$mode rc $?"
    cp "/tmp/$name/$mode/ckpt/metrics.jsonl" "$OUT/$name.$mode.metrics.jsonl" 2>/dev/null
    grep -E "Started a local Ray|torch.compile|init engine|CUDA graph|step 1/|step 8/" "/tmp/$name/$mode/run.log" 2>/dev/null \
      | cut -c1-160 | head -10; tail -1 "/tmp/$name/$mode/run.log" 2>/dev/null | cut -c1-120  # seconds since launch
  done
  tail -5 "$OUT/$name.log"
}

for step in "$@"; do
  echo "=== $step $(date -u +%T)"
  case $step in
    async1) modes async1 1 sync,colocate_async ;;
    async2) modes async2 2 sync,colocate_async,separate_async ;;
    async2_sync) modes async2_sync 2 sync ;;
    async4) modes async4 4 sync,colocate_async,separate_async --engines 2 --off-policy 3 ;;
    async2_deep) modes async2_deep 2 colocate_async,separate_async --off-policy 3 ;;
    async7b) modes async7b 2 sync,colocate_async --batch 16 --mini-batch 16 "${ASYNC7B[@]}" "${COLOCATED7B[@]}" ;;
    async7b_r2) modes async7b_r2 2 sync,colocate_async --batch 16 --mini-batch 16 "${ASYNC7B[@]}" \
             actor_rollout_ref.actor.megatron.optimizer_offload=true ;;
    async7b_dyn) modes async7b_dyn 2 sync,colocate_async --batch 16 --mini-batch 16 "${ASYNC7B[@]}" "${DYN7B[@]}" ;;
    async2_colo) modes async2_colo 2 sync,colocate_async ;;
    async7b4) modes async7b4 4 sync,colocate_async --batch 32 --mini-batch 32 "${ASYNC7B[@]}" "${DYN7B[@]}" \
             actor_rollout_ref.rollout.tensor_model_parallel_size=2 ;;
    async7b4_sep) modes async7b4_sep 4 separate_async --engines 2 --batch 32 --mini-batch 32 "${ASYNC7B[@]}" "${DYN7B[@]}" ;;
    async2_sync_bypass) modes async2_sync_bypass 2 sync algorithm.rollout_correction.bypass_mode=true ;;
    async2_sep_bypass) modes async2_sep_bypass 2 separate_async --off-policy 3 algorithm.rollout_correction.bypass_mode=true ;;
  esac
done
