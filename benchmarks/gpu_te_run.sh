#!/usr/bin/env bash
# Issue 23 device steps (one H100). Run from the root of /work/main's copy on the device, with
# this worktree's code in .gpuwt and the stack + TE overlay unpacked in /tmp/site, /tmp/site-te:
#   bash .gpuwt/benchmarks/gpu_te_run.sh repro_old check tests bench tests_all
# Steps: repro_old (main's megarl, TE spec, padded GRPO batch), check (this code, TE/SDPA x padded/packed
#        at 0.5B vs HF), tests (tests/gpu/test_te_spec.py), bench / bench_rmpad (actor throughput 1.5B,
#        TP=1, both specs), grpo_1p5b / grpo_shapes (update_policy on GRPO-shaped batches), e2e_new /
#        e2e_old (2 GRPO steps through main_ppo), tests_all (pytest -m gpu tests/). Logs under $OUT.
# Results: benchmarks/RESULTS.md (issue 23).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
ROOT=$PWD
OUT=${OUT:-$ROOT/outputs}; mkdir -p "$OUT"
NEW=/tmp/site:/tmp/site-te:$ROOT/.gpuwt
OLD=/tmp/site:/tmp/site-te:$ROOT
TR="torchrun --nproc_per_node=1"
PYTHONPATH=$NEW python3 -c "import torch, transformer_engine as te, megatron.core as mc, transformers as t; print('torch', torch.__version__, 'te', te.__version__, 'mcore', mc.__version__, 'transformers', t.__version__, torch.cuda.get_device_name())" 2>&1 | tail -1
for step in "$@"; do
  echo "=== $step $(date -u +%T)"
  case $step in
    repro_old) PYTHONPATH=$OLD NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=1 timeout 150 $TR .gpuwt/benchmarks/check_te_padded.py --shape 0.5b \
                 --variants transformer_engine:padded --localize > "$OUT/repro_old.log" 2>&1; echo rc $?
               grep -E "^# HF|^transformer_engine|^    |backend" "$OUT/repro_old.log" | sort | uniq -c | sort -rn | head -12 ;;
    check)     PYTHONPATH=$NEW timeout 240 $TR .gpuwt/benchmarks/check_te_padded.py --shape 0.5b --localize --time-iters 3 \
                 > "$OUT/check.log" 2>&1; echo rc $?
               grep -E "^# |^TE param|^    |update_policy s|^[a-z_]+:(padded|packed)|^variant|^(local|transformer_engine) " "$OUT/check.log" | cut -c1-400 ;;
    tests)     (cd .gpuwt && PYTHONPATH=$NEW timeout 240 python3 -m pytest -q -x tests/gpu/test_te_spec.py -m gpu -rA -s \
                 -p no:cacheprovider) > "$OUT/pytest_te.log" 2>&1; echo rc $?
               grep -E "HF\||passed|failed|PASSED|FAILED|Error|assert" "$OUT/pytest_te.log" | tail -30 ;;
    bench)     for impl in local transformer_engine; do
                 PYTHONPATH=$NEW CUDA_DEVICE_MAX_CONNECTIONS=1 timeout 270 $TR .gpuwt/benchmarks/bench_actor_throughput.py --tp 1 \
                   --micro-bs 2 --n-micro 4 --iters 5 --impl $impl --out actor_1p5b_$impl.json > "$OUT/bench_$impl.log" 2>&1; echo rc $?
                 grep -A8 "^# actor throughput" "$OUT/bench_$impl.log"; grep -E "failed|Error" "$OUT/bench_$impl.log" | head -5
               done ;;
    bench_rmpad) for impl in local transformer_engine; do
                 PYTHONPATH=$NEW CUDA_DEVICE_MAX_CONNECTIONS=1 timeout 200 $TR .gpuwt/benchmarks/bench_actor_throughput.py --tp 1 \
                   --micro-bs 2 --n-micro 4 --iters 5 --impl $impl --layouts rmpad --out actor_1p5b_rmpad_$impl.json \
                   > "$OUT/bench_rmpad_$impl.log" 2>&1; echo rc $?
                 grep -A8 "^# actor throughput" "$OUT/bench_rmpad_$impl.log"; grep -E "failed|Error" "$OUT/bench_rmpad_$impl.log" | head -5
               done ;;
    grpo_1p5b) for v in local:padded transformer_engine:padded local:packed transformer_engine:packed; do
                 PYTHONPATH=$NEW timeout 100 $TR .gpuwt/benchmarks/check_te_padded.py --shape 1.5b --rows 128 --prompt 512 \
                   --response 512 --micro 8 --time-iters 5 --no-hf --variants $v > "$OUT/grpo_1p5b_${v/:/_}.log" 2>&1; echo $v rc $?
                 grep -E "update_policy s|^(local|transformer_engine):(padded|packed)  " "$OUT/grpo_1p5b_${v/:/_}.log" | cut -c1-200
               done ;;
    e2e_new|e2e_old)  # issue 23's GRPO run: random Qwen2.5-0.5B shape, 64 prompts x 8, <= 32 + 224 tokens
               # (keys of main's verl-0.9.1 yaml; a yaml with `ray_init.num_cpus` needs that spelling instead)
               export MEGARL_DEMO_DIR=/tmp/gpu-demo
               [ -f /tmp/q05/model.safetensors ] || PYTHONPATH=$NEW python3 .gpuwt/benchmarks/grpo_model_dir.py /tmp/q05 > "$OUT/e2e_model.log" 2>&1
               if [ $step = e2e_new ]; then P=$NEW; D=.gpuwt; else P=$OLD; D=.; fi
               (cd $D && PYTHONPATH=$P timeout 280 python3 -m megarl.main_ppo actor_rollout_ref.model.path=/tmp/q05 trainer.device=cuda \
                 trainer.n_gpus_per_node=1 actor_rollout_ref.rollout.tensor_model_parallel_size=1 data.train_batch_size=64 \
                 data.max_prompt_length=32 data.max_response_length=224 actor_rollout_ref.rollout.n=8 \
                 actor_rollout_ref.actor.ppo_mini_batch_size=64 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
                 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 data.train_files=/tmp/gpu-demo/train.parquet \
                 data.val_files=/tmp/gpu-demo/val.parquet trainer.total_training_steps=2 trainer.val_before_train=false \
                 trainer.test_freq=-1 algorithm.adv_estimator=grpo trainer.logger=[console] ray_kwargs.ray_init.num_cpus=8 \
                 actor_rollout_ref.rollout.gpu_memory_utilization=0.3 ${E2E_EXTRA:-}) > "$OUT/$step.log" 2>&1; echo rc $?
               grep -iE "layer spec|non-finite|nan gradient|Traceback|Error|step [0-9]/|^  - " "$OUT/$step.log" | cut -c1-300 | tail -20 ;;
    tests_all) (cd .gpuwt && PYTHONPATH=$NEW timeout 420 python3 -m pytest -q -m gpu tests/ -rA -p no:cacheprovider) \
                 > "$OUT/pytest_gpu_all.log" 2>&1; echo rc $?
               grep -E "passed|failed|PASSED|FAILED|SKIPPED|Error" "$OUT/pytest_gpu_all.log" | tail -30 ;;
  esac
done
