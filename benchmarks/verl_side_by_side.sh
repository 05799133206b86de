#!/usr/bin/env bash
# The peer, side by side (issue 16 item 5): verl 0.9.1 on the GRPO workload of `gpu_session.sh e2e`.
#
# Runs on the GPU machine, from the repo root, in ONE device call after the stack's calls put vLLM 0.20.0,
# Ray, megatron-core in /tmp/site (and TE in /tmp/site-te). The verl part is built here by
# `bash benchmarks/prepare_verl_part.sh` into .gpuverl/ (git-ignored; this file travels as .gpuverl/run_verl.sh):
#   carry [".gpuverl"]   command: bash .gpuverl/run_verl.sh            (FSDP backend, the default)
#                                 bash .gpuverl/run_verl.sh megatron   (verl's Megatron backend, mbridge + TE)
#                                 bash .gpuverl/run_verl.sh fsdp megatron   (both, the time limit split in two)
#   bash .gpuverl/run_verl.sh --print-overrides fsdp    (prints the Hydra overrides, one per line; no run)
#
# Workload = megarl's e2e: random Qwen2.5-0.5B shape with the demo tokenizer (/tmp/q05, grpo_model_dir.py),
# the demo arithmetic data (/tmp/gpu-demo), 64 prompts x 8 responses, prompt <= 32, response <= 224 tokens,
# mini-batch 64, micro-batch 16, GRPO, colocated (hybrid engine), 3 steps, CUDA graphs on, vLLM at 0.3 of
# GPU memory, rollout TP=1, bf16, verl's defaults elsewhere (lr 1e-6, no KL, no reference model).
# verl specifics: rollout.mode=async (verl's only mode: vLLM's OpenAI server + agent loop), reward by
# verl_demo_reward.py (exact match, megarl.reward.demo_task). The HF config gets attn_implementation=sdpa and
# FSDP use_remove_padding=false, because flash-attn is not on the machine (verl's default wants
# flash_attention_2); Megatron keeps verl's packed (THD) sequences, with TE attention_backend=auto as megarl.
# Prints verl's per-step timing_s/* (seconds) and throughput from its console logger; logs under $OUT.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
REWARD=$HERE/verl_demo_reward.py
[ -f "$REWARD" ] || REWARD=$PWD/benchmarks/verl_demo_reward.py

overrides() {  # $1 = fsdp | megatron
  local common=(
    algorithm.adv_estimator=grpo
    data.train_files=/tmp/gpu-demo/train.parquet data.val_files=/tmp/gpu-demo/val.parquet
    data.train_batch_size=64 data.max_prompt_length=32 data.max_response_length=224
    actor_rollout_ref.model.path=/tmp/q05
    actor_rollout_ref.actor.ppo_mini_batch_size=64 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16
    actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.mode=async actor_rollout_ref.rollout.n=8
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 actor_rollout_ref.rollout.gpu_memory_utilization=0.3
    actor_rollout_ref.rollout.enforce_eager=false actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16
    actor_rollout_ref.rollout.calculate_log_probs=true
    reward.custom_reward_function.path="$REWARD" reward.custom_reward_function.name=compute_score
    trainer.device=cuda trainer.nnodes=1 trainer.n_gpus_per_node=1 trainer.total_training_steps=3
    trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=-1 trainer.logger=[console]
    trainer.use_v1="${VERL_USE_V1:-true}" trainer.default_local_dir=/tmp/verl_run_$1
    ray_kwargs.ray_init.num_cpus=8
    +actor_rollout_ref.model.override_config.attn_implementation=sdpa
  )
  case $1 in
    fsdp) printf '%s\n' "${common[@]}" actor_rollout_ref.model.use_remove_padding=false ;;
    megatron) printf '%s\n' --config-name=ppo_megatron_trainer "${common[@]}" \
            actor_rollout_ref.actor.megatron.vanilla_mbridge=true \
            actor_rollout_ref.actor.megatron.sequence_parallel=false \
            actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend=auto ;;
    *) echo "unknown backend '$1' (fsdp | megatron)" >&2; return 2 ;;
  esac
}

if [ "${1:-}" = "--print-overrides" ]; then overrides "${2:-fsdp}"; exit $?; fi

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export HYDRA_FULL_ERROR=1 RAY_DEDUP_LOGS=0 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH=/tmp/verl_site:/tmp/site:/tmp/site-te:$PWD
OUT=${OUT:-$PWD/outputs}; mkdir -p "$OUT"
BACKENDS=("$@"); [ ${#BACKENDS[@]} -gt 0 ] || BACKENDS=(fsdp)
LIMIT=${VERL_TIMEOUT:-$(( 420 / ${#BACKENDS[@]} ))}
T0=$(date +%s)
say() { echo "[verl +$(( $(date +%s) - T0 ))s] $*"; }

[ -d /tmp/site/vllm ] || { echo "no /tmp/site/vllm: stage the stack first (.gpustack calls)"; exit 3; }
if [ ! -f /tmp/verl_site/.unpacked ]; then
  rm -rf /tmp/verl_site; mkdir -p /tmp/verl_site
  xz -dc "$HERE/verl_site.tar.xz" | tar -x -C /tmp/verl_site && touch /tmp/verl_site/.unpacked || exit 4
fi
python3 -c "import verl, vllm, ray, torch, transfer_queue; print('verl', verl.__version__, 'vllm', vllm.__version__, 'ray', ray.__version__, 'torch', torch.__version__)" 2>&1 | tail -1
say "unpacked"

export MEGARL_DEMO_DIR=/tmp/gpu-demo
[ -f /tmp/q05/model.safetensors ] || python3 benchmarks/grpo_model_dir.py /tmp/q05 > "$OUT/verl_model.log" 2>&1 \
  || { tail -5 "$OUT/verl_model.log"; exit 5; }
say "model and data ready"

for b in "${BACKENDS[@]}"; do
  overrides "$b" > /dev/null || exit 2
  mapfile -t ARGS < <(overrides "$b")
  say "=== verl $b (timeout ${LIMIT}s)"
  timeout -k 15 "$LIMIT" python3 -m verl.trainer.main_ppo "${ARGS[@]}" > "$OUT/verl_$b.log" 2>&1
  say "rc $?"
  # a timed-out run leaves Ray's workers and vLLM holding the GPU (the image has no `ray` script on PATH)
  python3 -m ray.scripts.scripts stop --force > /dev/null 2>&1
  grep -aE "Traceback|Error|error:" "$OUT/verl_$b.log" | cut -c1-300 | tail -8
  python3 - "$OUT/verl_$b.log" <<'EOF'
import re, sys
keep = ("timing_s/", "timing_per_token_ms/", "perf/throughput", "perf/time_per_step", "response_length/mean",
        "critic/score/mean", "perf/max_memory_allocated_gb")
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r"step:(\d+) - (.*)", line)
    if not m:
        continue
    vals = {}
    for kv in m.group(2).split(" - "):
        k, _, v = kv.partition(":")
        num = re.search(r"-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?", re.sub(r"np\.\w+\(", "", v))  # np.float64(1.2)
        if k.strip().startswith(keep) and num:
            vals[k.strip()] = round(float(num.group()), 4)
    print("step", m.group(1), vals)
EOF
done
