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
#   env: VERL_TIMEOUT (s, split over the backends), VERL_RAY_CPUS (32), VERL_WATCHDOG_S (240), VERL_USE_V1 (true),
#        VERL_EXTRA_OVERRIDES (appended Hydra overrides)
#
# Workload = megarl's e2e with MODEL=l05: random Qwen2.5-0.5B shape as a Llama (no q/k/v bias: verl's agent loop
# takes a Qwen model_type as a Qwen tokenizer), the demo tokenizer (/tmp/l05, grpo_model_dir.py --llama),
# the demo arithmetic data (/tmp/gpu-demo), 64 prompts x 8 responses, prompt <= 32, response <= 224 tokens,
# mini-batch 64, micro-batch 16, GRPO, colocated (hybrid engine), 3 steps, CUDA graphs on, vLLM at 0.3 of
# GPU memory, rollout TP=1, bf16, verl's defaults elsewhere (lr 1e-6, no KL, no reference model).
# verl specifics: rollout.mode=async (verl's only mode: vLLM's OpenAI server + agent loop), reward by
# verl_demo_reward.py (exact match, megarl.reward.demo_task). The HF config gets attn_implementation=sdpa and
# FSDP use_remove_padding=false, because flash-attn is not on the machine (verl's default wants
# flash_attention_2); Megatron keeps verl's packed (THD) sequences, with TE attention_backend=auto as megarl.
# Prints verl's per-step timing_s/* (seconds) and throughput from its console logger; logs under $OUT.
#
# Ray logical CPUs (VERL_RAY_CPUS, default 32; Ray lets them exceed the 16 cores). verl 0.9.1's v1 trainer holds
# for the whole run: TransferQueueController num_cpus=1 (transfer_queue/controller.py:943), num_data_storage_units
# x SimpleStorageUnit num_cpus=1 (storage/simple_storage.py:722; verl's default 8 units) and the global_pool
# placement group bundle {CPU: max_colocate_count=3, GPU: 1} (verl/single_controller/ray/base.py:146, :192), i.e.
# 1 + 8 + 3 = 12, plus 1 free CPU to place each default-resource actor (TaskRunnerV1, 8 reward loop workers,
# 8 agent loop workers, vLLM server, load balancer). With num_cpus=8 the 8th storage unit never starts and tq.init
# waits on it forever without a timeout (transfer_queue/utils/zmq_utils.py:674), silently: run 7 hung there.
# `transfer_queue.enable=false` does not help: TaskRunnerV1.run sets it back to True (verl/trainer/main_ppo.py:143).
# Watchdog: no `step:` line VERL_WATCHDOG_S (default 240) s after launch, and again just before the time limit,
# prints Ray's free resources, who holds them and what waits (raylet debug_state.txt), pending actors / placement
# groups (gcs_server.out), raylet warnings (e.g. "cannot be scheduled right now") and the tails of the newest
# /tmp/ray/session_latest/logs/*.err|*.out; the full dump goes to $OUT/verl_<backend>_watchdog.txt.
# VERL_EXTRA_OVERRIDES (space-separated Hydra overrides) is appended last, e.g. trainer.use_v1=false.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
REWARD=$HERE/verl_demo_reward.py
[ -f "$REWARD" ] || REWARD=$PWD/benchmarks/verl_demo_reward.py

overrides() {  # $1 = fsdp | megatron
  local common=(
    algorithm.adv_estimator=grpo
    data.train_files=/tmp/gpu-demo/train.parquet data.val_files=/tmp/gpu-demo/val.parquet
    data.train_batch_size=64 data.max_prompt_length=32 data.max_response_length=224
    actor_rollout_ref.model.path=/tmp/l05
    actor_rollout_ref.actor.ppo_mini_batch_size=64 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16
    actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.mode=async actor_rollout_ref.rollout.n=8
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 actor_rollout_ref.rollout.gpu_memory_utilization=0.3
    actor_rollout_ref.rollout.enforce_eager=false actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16
    actor_rollout_ref.rollout.calculate_log_probs=true
    reward.custom_reward_function.path="$REWARD" reward.custom_reward_function.name=compute_score
    trainer.device=cuda trainer.nnodes=1 trainer.n_gpus_per_node=1 trainer.total_training_steps=3
    trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=-1 trainer.logger=[console]
    trainer.use_v1="${VERL_USE_V1:-true}" trainer.default_local_dir=/tmp/verl_run_$1
    ray_kwargs.ray_init.num_cpus="${VERL_RAY_CPUS:-32}"
    +actor_rollout_ref.model.override_config.attn_implementation=sdpa
  )
  local extra=(); read -r -a extra <<< "${VERL_EXTRA_OVERRIDES:-}"
  case $1 in
    fsdp) printf '%s\n' "${common[@]}" actor_rollout_ref.model.use_remove_padding=false "${extra[@]}" ;;
    megatron) printf '%s\n' --config-name=ppo_megatron_trainer "${common[@]}" \
            actor_rollout_ref.actor.megatron.vanilla_mbridge=true \
            actor_rollout_ref.actor.megatron.sequence_parallel=false \
            actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend=auto "${extra[@]}" ;;
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
[ -f /tmp/l05/model.safetensors ] || python3 benchmarks/grpo_model_dir.py /tmp/l05 --llama > "$OUT/verl_model.log" 2>&1 \
  || { tail -5 "$OUT/verl_model.log"; exit 5; }
say "model and data ready"

ovr() { printf '%s\n' "${ARGS[@]}" | sed -n "s/^$1=//p" | tail -1; }  # last value of a Hydra override

cpu_check() {  # the Ray CPUs verl's trainer holds for the whole run (see the header); refuses a run that would hang
  local cpus units held v1
  cpus=$(ovr ray_kwargs.ray_init.num_cpus); v1=$(ovr trainer.use_v1)
  units=$(ovr transfer_queue.backend.SimpleStorage.num_data_storage_units); units=${units:-8}
  if [ "${v1,,}" = false ]; then held=3; else held=$(( 1 + units + 3 )); fi
  say "Ray logical CPUs ${cpus:-all cores}; held: $([ "${v1,,}" = false ] || echo "TQ controller 1 + $units storage units + ")global_pool bundle 3 = $held, +1 to place the rest"
  if [ -n "$cpus" ] && [ "$cpus" -lt $(( held + 1 )) ]; then
    say "ray_kwargs.ray_init.num_cpus=$cpus < $(( held + 1 )): verl would wait for CPUs forever; not run"; return 1
  fi
}

ray_dump() {  # $1 = why. A bounded digest of what Ray has not scheduled and of its newest logs (full text: $WD)
  [ -n "$SESS" ] || SESS=$(readlink -f /tmp/ray/session_latest)  # this run's session, fixed at the first dump
  local L=$SESS/logs f n=0
  {
    echo "=== watchdog verl $b +$(( $(date +%s) - TB ))s: $1 ($L)"
    echo "--- verl log, last lines (config dump left out)"
    sed 's/\x1b\[[0-9;]*m//g' "$OUT/verl_$b.log" | grep -avE "^\([^)]*\) +['{}]|^\([^)]*\) *$|logging\.cc|^ +@ " \
      | tail -n 12 | cut -c1-300
    echo "--- raylet debug_state.txt: free resources, who holds them, what waits"
    grep -aoE '"available": ?\{[^}]*\}' "$L/debug_state.txt" 2>/dev/null | head -1 | cut -c1-400
    grep -aE "InitialConfigResources|Infeasible queue|num_waiting_for|^ *- \(language" "$L/debug_state.txt" 2>/dev/null \
      | sed 's/ worker_id=[0-9a-f]*//' | cut -c1-200 | head -n 40
    echo "--- gcs_server.out: pending actors / placement groups (last report); raylet/gcs warnings and errors"
    grep -aE "Pending actors count|Pending placement groups count|Infeasible placement" "$L/gcs_server.out" 2>/dev/null | tail -n 3
    grep -ahE "^\[[^]]* [WEF] [0-9]+ " "$L/raylet.out" "$L/gcs_server.out" 2>/dev/null | tail -n 6 | cut -c1-600
    echo "--- newest Ray worker/daemon *.err / *.out with content (last 10 lines each)"
    for f in $(find "$L" -maxdepth 1 \( -name '*.err' -o -name '*.out' \) ! -name raylet.out ! -name gcs_server.out \
               -size +0 -printf '%T@ %p\n' 2>/dev/null | sort -rn | cut -d' ' -f2- | head -n 60); do
      grep -aqvE '^:(job_id|actor_name|task_name):' "$f" || continue
      echo "## ${f##*/}"; grep -avE '^:(job_id|actor_name|task_name):' "$f" | tail -n 10 | cut -c1-240
      n=$(( n + 1 )); [ "$n" -lt 8 ] || break
    done
  } > "$WD.part" 2>&1
  cat "$WD.part" >> "$WD"; head -c "${VERL_WATCHDOG_PRINT:-4500}" "$WD.part"; echo; rm -f "$WD.part"
}

WATCH=${VERL_WATCHDOG_S:-240}
for b in "${BACKENDS[@]}"; do
  overrides "$b" > /dev/null || exit 2
  mapfile -t ARGS < <(overrides "$b")
  cpu_check || exit 6
  say "=== verl $b (timeout ${LIMIT}s, watchdog ${WATCH}s)"
  WD=$OUT/verl_${b}_watchdog.txt; : > "$WD"; TB=$(date +%s); SESS=
  timeout -k 15 "$LIMIT" python3 -m verl.trainer.main_ppo "${ARGS[@]}" > "$OUT/verl_$b.log" 2>&1 &
  PID=$!; early=0; late=0
  while kill -0 "$PID" 2>/dev/null; do
    sleep 5; el=$(( $(date +%s) - TB ))
    if [ $early = 0 ] && [ "$el" -ge "$WATCH" ] && [ "$el" -lt $(( LIMIT - 15 )) ] \
       && ! grep -aqE "(^|[^_[:alnum:]])step:[0-9]+ - " "$OUT/verl_$b.log"; then
      ray_dump "no step line after ${WATCH}s"; early=1
    fi
    if [ $late = 0 ] && [ "$el" -ge $(( LIMIT - 15 )) ]; then ray_dump "${LIMIT}s limit in 15s"; late=1; fi
  done
  wait "$PID"; rc=$?
  say "rc $rc$([ $rc = 124 ] && echo ' (timed out)')"
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
