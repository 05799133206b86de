#!/usr/bin/env bash
# One device call on a machine where ../shared/gpu-stack put vLLM + Ray + megatron-core in /tmp/site and
# transformer-engine in /tmp/site-te. Runs the named steps from the repo root, logs and JSON under $OUT:
#   bash benchmarks/gpu_session.sh tests hybrid hybrid_eager      (issue 16: GPU tests, sync + rollout)
#   bash benchmarks/gpu_session.sh e2e e2e_fp8 actor7b            (issues 16/23: GRPO end to end, FP8, 7B actor)
# Steps:
#   tests        pytest -m gpu tests/gpu but the e2e module (TE spec, direct sync into vLLM; 2-GPU tests skip on one GPU)
#   e2e_tests    pytest -m gpu tests/gpu/test_gpu_e2e.py (main_ppo: GRPO demo learns, PPO + critic + resume)
#   hybrid       benchmarks/bench_hybrid_gpu.py 1.5B, CUDA graphs on: sync direct/reload vs d2d copy, rollout vs vLLM
#   hybrid_eager the same rollout comparison with enforce_eager=true (graphs off)
#   e2e          3 GRPO steps through `python -m megarl.main_ppo`, random Qwen2.5-0.5B shape (TE spec, graphs on)
#   e2e_fp8      the same with override_transformer_config.fp8=hybrid (train/rollout log-prob gap, step time)
#   shapes       update_policy time on the e2e batch shape: TE/SDPA x padded/packed, and TE packed bucketed
#   actor7b      actor update vs plain megatron-core, Qwen2.5-7B layer shape (8 layers), TE spec: padded, padded
#                without TE's wgrad-accumulation fusion (the plain arm's kernels), packed, and FP8 padded
#   actor1p5     the same at the 1.5B shape, padded and packed
#   actor7b_full all 28 layers of the 7B shape, SGD without momentum, padded, both arm orders (nvidia-h200)
#   actor7b_acc  the same, plain arm first, 16 micro-batches per optimizer step (nvidia-h200)
#   moe_tests    pytest -m gpu tests/models/test_gpu_moe.py (MoE families on the TE spec vs HF, export)
#   e2e_moe      the e2e run on a Qwen3-MoE of the same size (issue 18: one-GPU MoE step + sync into vLLM)
#   async        bench_async_rollout.py on CUDA, 256 samples (issue 17)
# Two GPUs (issue 20):
#   tests2       the 2-GPU tests (TP=2 log-probs / update vs TP=1 and HF, sync bitwise, direct sync gathering into vLLM)
#   e2e_tp2      the e2e run with actor TP=2 and one vLLM TP=2 replica;  e2e_tp2_r1: actor TP=2, two vLLM TP=1 replicas
#   e2e_pp2      actor PP=2, two vLLM TP=1 replicas;  e2e_ep2: a Qwen3-MoE of the same size (8 experts, top 2), EP=2
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/site:/tmp/site-te:$PWD
OUT=${OUT:-$PWD/outputs}; mkdir -p "$OUT"
TR="torchrun --standalone --nproc_per_node=1"  # --standalone: a free port, so two can run side by side
python3 -c "import torch, vllm, megatron.core as mc; import transformer_engine as te; print('torch', torch.__version__, 'vllm', vllm.__version__, 'mcore', mc.__version__, 'te', te.__version__, torch.cuda.get_device_name())" 2>&1 | tail -1

source benchmarks/gpu_e2e.sh
e2e() {  # $1 = log name, rest = extra overrides; MODEL (q05 | qmoe | l05), GPUS, RTP (rollout TP) from the environment
  local name=$1; shift
  local model=/tmp/${MODEL:-q05}
  export MEGARL_DEMO_DIR=/tmp/gpu-demo
  [ -f $model/model.safetensors ] || python3 benchmarks/grpo_model_dir.py $model $([ "${MODEL:-}" = qmoe ] && echo --moe) $([ "${MODEL:-}" = l05 ] && echo --llama) \
    > "$OUT/e2e_model_${MODEL:-q05}.log" 2>&1
  run_e2e "$name" "$model" "${GPUS:-1}" 280 actor_rollout_ref.rollout.tensor_model_parallel_size=${RTP:-1} \
    data.train_batch_size=64 data.max_prompt_length=32 data.max_response_length=224 actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 trainer.total_training_steps=3 \
    actor_rollout_ref.actor.megatron.sequence_parallel=false actor_rollout_ref.rollout.gpu_memory_utilization=0.3 "$@"
}

for step in "$@"; do
  echo "=== $step $(date -u +%T)"
  case $step in
    tests)   timeout 330 python3 -m pytest -q -m gpu tests/gpu --ignore=tests/gpu/test_gpu_e2e.py -rA -p no:cacheprovider \
               > "$OUT/pytest_gpu.log" 2>&1; echo rc $?
             grep -E "passed|failed|PASSED|FAILED|SKIPPED|Error" "$OUT/pytest_gpu.log" | tail -20 ;;
    e2e_tests) timeout 570 python3 -m pytest -q -m gpu tests/gpu/test_gpu_e2e.py -rA -p no:cacheprovider --durations=5 \
               > "$OUT/pytest_gpu_e2e.log" 2>&1; echo rc $?
             grep -E "passed|failed|PASSED|FAILED|SKIPPED|Error|slowest|call " "$OUT/pytest_gpu_e2e.log" | tail -20 ;;
    hybrid)  timeout 300 $TR benchmarks/bench_hybrid_gpu.py --shape 1.5b --iters 3 --response-len 256 --out hybrid_1p5b.json \
               > "$OUT/hybrid.log" 2>&1; echo rc $?
             grep -A12 -E "^# (hybrid|direct sync parts)" "$OUT/hybrid.log"; grep -E "Error|error:" "$OUT/hybrid.log" | tail -5 ;;
    hybrid_eager) timeout 240 $TR benchmarks/bench_hybrid_gpu.py --shape 1.5b --iters 3 --response-len 256 --enforce-eager \
               --skip-sync --out hybrid_1p5b_eager.json > "$OUT/hybrid_eager.log" 2>&1; echo rc $?
             grep -A6 "^# hybrid" "$OUT/hybrid_eager.log"; grep -E "Error|error:" "$OUT/hybrid_eager.log" | tail -5 ;;
    e2e)     e2e e2e ;;
    e2e_fp8) e2e e2e_fp8 +actor_rollout_ref.actor.megatron.override_transformer_config.fp8=hybrid \
               +actor_rollout_ref.actor.megatron.override_transformer_config.fp8_recipe=delayed ;;
    shapes)  # update_policy on the e2e run's batch shape (0.5B, 512 rows, <= 32 + 224 tokens, micro 16): spec x layout
             timeout 200 $TR benchmarks/check_te_padded.py --shape 0.5b --rows 512 --prompt 32 --response 224 --micro 16 \
               --no-hf --time-iters 3 > "$OUT/shapes.log" 2>&1; echo rc $?
             grep -E "update_policy s|^(local|transformer_engine):(padded|packed)  |Error" "$OUT/shapes.log" | cut -c1-160 ;;
    profile) # the e2e model (small vocabulary): TE packed vs SDPA padded, timed and profiled
             timeout 240 $TR benchmarks/check_te_padded.py --shape 0.5b-v1k --rows 512 --prompt 32 --response 224 --micro 16 \
               --no-hf --time-iters 3 --profile --variants transformer_engine:packed,local:padded > "$OUT/profile.log" 2>&1; echo rc $?
             grep -E "update_policy s|^(local|transformer_engine):(padded|packed)  |Error" "$OUT/profile.log"
             grep -A22 "profile (compute_log_prob" "$OUT/profile.log" | cut -c1-62,100-175 ;;
    # two GPUs (issue 20): colocated GRPO with the actor split in two, vLLM one TP=2 replica or two TP=1 replicas
    e2e_tp2) GPUS=2 RTP=2 e2e e2e_tp2 actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 ;;
    e2e_tp2_r1) GPUS=2 RTP=1 e2e e2e_tp2_r1 actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 ;;
    e2e_pp2) GPUS=2 RTP=1 e2e e2e_pp2 actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2 ;;
    e2e_ep2) MODEL=qmoe GPUS=2 RTP=1 e2e e2e_ep2 actor_rollout_ref.actor.megatron.expert_model_parallel_size=2 ;;
    tests2)  timeout 300 python3 -m pytest -q -m gpu tests/gpu/test_gpu_paths.py tests/gpu/test_vllm_direct_sync.py -rA \
               -p no:cacheprovider > "$OUT/pytest_gpu2.log" 2>&1; echo rc $?
             grep -E "passed|failed|PASSED|FAILED|SKIPPED|Error" "$OUT/pytest_gpu2.log" | tail -12 ;;
    e2e_sdpa) e2e e2e_sdpa ++actor_rollout_ref.actor.megatron.override_transformer_config.transformer_impl=local \
               actor_rollout_ref.model.use_remove_padding=false ;;
    actor7b) # one megarl arm per process (two 7B-shape workers do not fit), each beside its own plain arm
             for arm in padded padded_unfused rmpad padded:--fp8; do
               layout=${arm%%:*}; fp8=${arm#$layout}; fp8=${fp8#:}
               CUDA_DEVICE_MAX_CONNECTIONS=1 timeout 200 $TR benchmarks/bench_actor_throughput.py --tp 1 --shape 7b --layers 8 \
                 --micro-bs 1 --n-micro 4 --iters 4 --impl transformer_engine --layouts $layout $fp8 \
                 --out "actor_7b_${layout}${fp8:+_fp8}.json" > "$OUT/actor7b_${layout}${fp8:+_fp8}.log" 2>&1; echo rc $?
               grep -A5 "^# actor throughput" "$OUT/actor7b_${layout}${fp8:+_fp8}.log" | tail -4
               grep -E "overhead|failed|Error" "$OUT/actor7b_${layout}${fp8:+_fp8}.log" | head -4
             done ;;
    actor7b_full) # the whole Qwen2.5-7B shape (28 layers) with SGD without momentum (Adam's state would not fit):
             # megarl vs plain megatron-core, TE spec, padded; both orders (the later arm runs on a warmer GPU). H200.
             for order in "" --megarl-first; do
               CUDA_DEVICE_MAX_CONNECTIONS=1 timeout 280 $TR benchmarks/bench_actor_throughput.py --tp 1 --shape 7b \
                 --micro-bs 1 --n-micro 4 --iters 4 --impl transformer_engine --layouts padded --optimizer sgd $order \
                 --out "actor_7b_full${order:+_megarl_first}.json" > "$OUT/actor7b_full${order}.log" 2>&1; echo rc $?
               grep -A4 "^# actor throughput" "$OUT/actor7b_full${order}.log" | tail -3
               grep -E "overhead|failed|Error" "$OUT/actor7b_full${order}.log" | head -4
             done ;;
    actor1p5) for layout in padded rmpad; do
               CUDA_DEVICE_MAX_CONNECTIONS=1 timeout 200 $TR benchmarks/bench_actor_throughput.py --tp 1 --shape 1.5b \
                 --micro-bs 2 --n-micro 4 --iters 4 --impl transformer_engine --layouts $layout \
                 --out "actor_1p5b_$layout.json" > "$OUT/actor1p5_$layout.log" 2>&1; echo rc $?
               grep -A4 "^# actor throughput" "$OUT/actor1p5_$layout.log" | tail -3
               grep -E "overhead|failed|Error" "$OUT/actor1p5_$layout.log" | head -4
             done ;;
    e2e_moe) MODEL=qmoe e2e e2e_moe ;;
    actor7b_acc) # actor7b_full with 16 micro-batches per optimizer step (an RL mini-batch is many micro-batches): H200
             CUDA_DEVICE_MAX_CONNECTIONS=1 timeout 500 $TR benchmarks/bench_actor_throughput.py --tp 1 --shape 7b \
               --micro-bs 1 --n-micro 16 --warmup 1 --iters 3 --impl transformer_engine --layouts padded --optimizer sgd \
               --out actor_7b_acc16.json > "$OUT/actor7b_acc16.log" 2>&1; echo rc $?
             grep -A4 "^# actor throughput" "$OUT/actor7b_acc16.log" | tail -3
             grep -E "overhead|failed|Error" "$OUT/actor7b_acc16.log" | head -4 ;;
    moe_tests) timeout 400 python3 -m pytest -q -m gpu tests/models/test_gpu_moe.py -rA -p no:cacheprovider \
               > "$OUT/pytest_gpu_moe.log" 2>&1; echo rc $?
             grep -E "passed|failed|PASSED|FAILED|SKIPPED|Error" "$OUT/pytest_gpu_moe.log" | tail -8 ;;
    async)   # issue 17: async (per-request agent loops) vs sync (batched) rollout, skewed lengths and tool latency
             timeout 320 python3 benchmarks/bench_async_rollout.py --device cuda --samples 256 --json "$OUT/async.json" \
               > "$OUT/async.log" 2>&1; echo rc $?
             grep -vE "^(INFO|WARNING|\(|\[)" "$OUT/async.log" | tail -12 ;;
  esac
done
