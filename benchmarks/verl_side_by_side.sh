#!/usr/bin/env bash
# The peer, side by side (issues 16 and 31): verl 0.9.1 on megarl's GRPO workloads, same stack, same GPUs.
#
# Runs on the GPU machine, from the repo root, after the stack's calls put vLLM 0.26.0, Ray 2.60, megatron-core
# 0.19.2 in /tmp/site and TE 2.20.2 in /tmp/site-te (scripts/prepare_gpu_stack.sh). The verl part is built here by
# `bash benchmarks/prepare_verl_part.sh` into .gpuverl/ (git-ignored; this file travels as .gpuverl/run_verl.sh, and
# run as benchmarks/verl_side_by_side.sh it unpacks .gpuverl/verl_site.tar.xz):
#   carry [".gpuverl"]   command: bash .gpuverl/run_verl.sh            (FSDP backend, 0.5B, 1 GPU)
#                                 bash .gpuverl/run_verl.sh megatron   (verl's Megatron backend, mbridge + TE, 0.5B)
#                                 bash .gpuverl/run_verl.sh megatron7b (Megatron backend, 7B, 2 GPUs: gpu_scale.sh verl7b_tp2)
#   bash .gpuverl/run_verl.sh --unpack    (unpacks the part into /tmp/verl_site, nothing else: a queue's staging call)
#   bash .gpuverl/run_verl.sh --print-overrides megatron7b   (prints the Hydra overrides, one per line; no run)
#   env: VERL_TIMEOUT (s, split over the backends), VERL_RAY_CPUS (32), VERL_WATCHDOG_S (240), VERL_USE_V1 (true),
#        VERL_EXTRA_OVERRIDES (Hydra overrides appended; one naming a workload key replaces its value)
#
# fsdp, megatron = megarl's e2e with MODEL=l05: random Qwen2.5-0.5B shape as a Llama (/tmp/l05, grpo_model_dir.py
# --llama), 64 prompts x 8, prompt <= 32, response <= 224, mini-batch 64, micro-batch 16, 1 GPU, rollout TP=1 at 0.3,
# 3 steps, verl's defaults elsewhere (lr 1e-6, no KL, no reference model).
# megatron7b = gpu_scale.sh e2e7b_tp2 (SCALE7B + param_offload, vLLM at 0.5): random Qwen2.5-7B shape as a Llama
# (/tmp/l7b, grpo_model_dir.py --7b --llama: vocabulary 152,064, untied), actor and reference TP=2 (sequence
# parallel, verl's default), one vLLM TP=2 replica at 0.5, 16 prompts x 8, prompt <= 64, response <= 1,024,
# mini-batch 16, micro-batch 2, log-prob micro-batch 16, actor param + optimizer offload, reference param offload,
# KL loss 0.001, 5 steps, 2 GPUs. Responses run to 1,024 tokens as in megarl's run: the random policy over 152,064
# ids rarely samples EOS (no ignore_eos in either; response_length/mean and clip_ratio are printed to check).
# Why a Llama: verl's agent loop picks its token builder by model_type, and its Qwen builder (qwen2) refuses a
# tokenizer where "\n" is not one token, as the demo tokenizer's (verl/utils/tokenizer/continuous_token.py:557).
# Common: rollout.mode=async (verl's only mode: vLLM's OpenAI server + agent loop), reward by verl_demo_reward.py
# (exact match, megarl.reward.demo_task), CUDA graphs on, bf16. The HF config gets attn_implementation=sdpa and
# FSDP use_remove_padding=false (flash-attn is not on the machine; verl's default wants flash_attention_2);
# Megatron keeps verl's packed (THD) sequences, with TE attention_backend=auto as megarl, and the legacy mbridge
# (vanilla_mbridge=true): Megatron-Bridge, verl's default, is not shipped (benchmarks/prepare_verl_part.sh says why).
# Prints verl's per-step timing_s/* (seconds), perf/throughput (tokens/s/GPU), torch's peak memory per step, and
# each GPU's peak device memory in use (nvidia-smi, 1 s samples); logs under $OUT.
#
# Ray logical CPUs (VERL_RAY_CPUS, default 32; Ray lets them exceed the 16 cores). verl 0.9.1's v1 trainer holds
# for the whole run: TransferQueueController num_cpus=1 (transfer_queue/controller.py:943), num_data_storage_units
# x SimpleStorageUnit num_cpus=1 (storage/simple_storage.py:722; verl's default 8 units) and the global_pool
# placement group bundle {CPU: max_colocate_count=3, GPU: 1} per GPU (verl/single_controller/ray/base.py:146, :192),
# i.e. 1 + 8 + 3 x GPUs (12 on one GPU), plus 1 free CPU to place each default-resource actor (TaskRunnerV1, 8 reward loop workers,
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

overrides() {  # $1 = fsdp | megatron | megatron7b
  local base=(
    algorithm.adv_estimator=grpo
    data.train_files=/tmp/gpu-demo/train.parquet data.val_files=/tmp/gpu-demo/val.parquet
    actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.mode=async actor_rollout_ref.rollout.enforce_eager=false
    actor_rollout_ref.rollout.calculate_log_probs=true
    reward.custom_reward_function.path="$REWARD" reward.custom_reward_function.name=compute_score
    trainer.device=cuda trainer.nnodes=1
    trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=-1 trainer.logger=[console]
    trainer.use_v1="${VERL_USE_V1:-true}" trainer.default_local_dir=/tmp/verl_run_$1
    ray_kwargs.ray_init.num_cpus="${VERL_RAY_CPUS:-32}"
    +actor_rollout_ref.model.override_config.attn_implementation=sdpa
  )
  local w05=(
    data.train_batch_size=64 data.max_prompt_length=32 data.max_response_length=224
    actor_rollout_ref.model.path=/tmp/l05
    actor_rollout_ref.actor.ppo_mini_batch_size=64 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16
    actor_rollout_ref.rollout.n=8
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 actor_rollout_ref.rollout.gpu_memory_utilization=0.3
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16
    trainer.n_gpus_per_node=1 trainer.total_training_steps=3
  )
  # = gpu_scale.sh's SCALE7B + e2e7b_tp2's param_offload and 0.5 (the reference's TP follows the actor's in verl's YAML)
  local w7b=(
    actor_rollout_ref.model.path=/tmp/l7b trainer.n_gpus_per_node=2
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 actor_rollout_ref.rollout.tensor_model_parallel_size=2
    data.train_batch_size=16 data.max_prompt_length=64 data.max_response_length=1024 actor_rollout_ref.rollout.n=8
    actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16
    actor_rollout_ref.actor.megatron.optimizer_offload=true actor_rollout_ref.ref.megatron.param_offload=true
    actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.kl_loss_coef=0.001 trainer.total_training_steps=5
    actor_rollout_ref.actor.megatron.param_offload=true actor_rollout_ref.rollout.gpu_memory_utilization=0.5
  )
  # mbridge 0.15.1 reads hf_config.rope_theta, which transformers 5 keeps only in rope_parameters: set it back
  # (grpo_model_dir.py's value) through verl's model.override_config, which verl setattr's on the HF config
  local mcore=(--config-name=ppo_megatron_trainer actor_rollout_ref.actor.megatron.vanilla_mbridge=true
    +actor_rollout_ref.model.override_config.rope_theta=1000000.0
    actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend=auto)
  local extra=(); read -r -a extra <<< "${VERL_EXTRA_OVERRIDES:-}"
  # Hydra refuses a key twice: an extra override replaces the workload's value of its key (the last one kept)
  last_wins() { awk '{k = $0; sub(/=.*/, "", k); sub(/^\+/, "", k); line[NR] = $0; key[NR] = k; last[k] = NR}
                     END {for (i = 1; i <= NR; i++) if (last[key[i]] == i) print line[i]}'; }
  case $1 in
    fsdp) printf '%s\n' "${base[@]}" "${w05[@]}" actor_rollout_ref.model.use_remove_padding=false "${extra[@]}" | last_wins ;;
    megatron) printf '%s\n' "${mcore[@]}" "${base[@]}" "${w05[@]}" \
            actor_rollout_ref.actor.megatron.sequence_parallel=false "${extra[@]}" | last_wins ;;
    megatron7b) printf '%s\n' "${mcore[@]}" "${base[@]}" "${w7b[@]}" "${extra[@]}" | last_wins ;;
    *) echo "unknown backend '$1' (fsdp | megatron | megatron7b)" >&2; return 2 ;;
  esac
}

if [ "${1:-}" = "--print-overrides" ]; then overrides "${2:-fsdp}"; exit $?; fi

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export HYDRA_FULL_ERROR=1 RAY_DEDUP_LOGS=0 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export VLLM_USE_FLASHINFER_SAMPLER=0  # as gpu_scale.sh: vLLM 0.26 imports flashinfer for its sampler otherwise; none shipped
export PYTHONPATH=/tmp/verl_site:/tmp/site:/tmp/site-te:$PWD
OUT=${OUT:-$PWD/outputs}; mkdir -p "$OUT"
BACKENDS=("$@"); [ ${#BACKENDS[@]} -gt 0 ] || BACKENDS=(fsdp)
LIMIT=${VERL_TIMEOUT:-$(( 420 / ${#BACKENDS[@]} ))}
T0=$(date +%s)
say() { echo "[verl +$(( $(date +%s) - T0 ))s] $*"; }

[ -d /tmp/site/vllm ] || { echo "no /tmp/site/vllm: stage the stack first (.gpustack calls)"; exit 3; }
PART=$HERE/verl_site.tar.xz; [ -f "$PART" ] || PART=$PWD/.gpuverl/verl_site.tar.xz  # run as benchmarks/verl_side_by_side.sh
SUM=$(sha256sum "$PART" 2>/dev/null | cut -c1-16)
[ -n "$SUM" ] || [ -f /tmp/verl_site/.unpacked ] || { echo "no verl part: carry .gpuverl (benchmarks/prepare_verl_part.sh)"; exit 4; }
if [ -n "$SUM" ] && [ "$(cat /tmp/verl_site/.unpacked 2>/dev/null)" != "$SUM" ]; then
  rm -rf /tmp/verl_site; mkdir -p /tmp/verl_site
  xz -dc "$PART" | tar -x -C /tmp/verl_site && echo "$SUM" > /tmp/verl_site/.unpacked || exit 4
fi
# mbridge 0.15.1 reads ModelType.encoder_and_decoder, which megatron-core 0.19 removed (verl 0.9.1 itself reads it
# through getattr); the same getattr here, idempotent.
sed -i 's/== ModelType\.encoder_and_decoder:/== getattr(ModelType, "encoder_and_decoder", None):/' \
  /tmp/verl_site/mbridge/core/util.py
# --unpack: only the above, in the call that carries .gpuverl (a later call's copy of the tree drops it, so a queue
# started in that call finds the part gone by the time its verl step runs)
[ "${BACKENDS[0]}" = --unpack ] && { say "unpacked into /tmp/verl_site"; exit 0; }
python3 -c "import verl, vllm, ray, torch, transfer_queue, megatron.core as m; print('verl', verl.__version__, 'vllm', vllm.__version__, 'ray', ray.__version__, 'torch', torch.__version__, 'mcore', m.__version__)" 2>&1 | tail -1
say "unpacked"

export MEGARL_DEMO_DIR=/tmp/gpu-demo
for b in "${BACKENDS[@]}"; do  # the model directory each workload names (tokenizer.json is written after the weights)
  case $b in megatron7b) dir=/tmp/l7b flags=(--7b --llama) ;; *) dir=/tmp/l05 flags=(--llama) ;; esac
  [ -f $dir/tokenizer.json ] || timeout 300 python3 benchmarks/grpo_model_dir.py $dir "${flags[@]}" >> "$OUT/verl_model.log" 2>&1 \
    || { tail -5 "$OUT/verl_model.log"; exit 5; }
done
say "model and data ready"

ovr() { printf '%s\n' "${ARGS[@]}" | sed -n "s/^$1=//p" | tail -1; }  # last value of a Hydra override

cpu_check() {  # the Ray CPUs verl's trainer holds for the whole run (see the header); refuses a run that would hang
  local cpus units held v1 gpus
  cpus=$(ovr ray_kwargs.ray_init.num_cpus); v1=$(ovr trainer.use_v1); gpus=$(ovr trainer.n_gpus_per_node)
  units=$(ovr transfer_queue.backend.SimpleStorage.num_data_storage_units); units=${units:-8}
  if [ "${v1,,}" = false ]; then held=$(( 3 * gpus )); else held=$(( 1 + units + 3 * gpus )); fi
  say "Ray logical CPUs ${cpus:-all cores}; held: $([ "${v1,,}" = false ] || echo "TQ controller 1 + $units storage units + ")global_pool bundles 3 x $gpus GPUs = $held, +1 to place the rest"
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
  SMI=$OUT/verl_${b}_gpu_mem.csv  # device memory in use per GPU each second (vLLM's pool included), for the peak
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 1000 > "$SMI" 2>/dev/null & SMIPID=$!
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
  kill "$SMIPID" 2>/dev/null; wait "$SMIPID" 2>/dev/null
  awk -F', *' '$2 > m[$1] {m[$1] = $2} END {for (g in m) printf "GPU %s peak memory in use %.1f GiB (nvidia-smi)\n", g, m[g] / 1024}' "$SMI" | sort
  say "rc $rc$([ $rc = 124 ] && echo ' (timed out)')"
  # a timed-out or failed run leaves Ray's workers and vLLM holding the GPU (the image has no `ray` script on
  # PATH); `ray stop` ends every Ray process on the host, a megarl run on the other GPUs too, so only then
  [ $rc = 0 ] || python3 -m ray.scripts.scripts stop --force > /dev/null 2>&1
  grep -aE "Traceback|Error|error:" "$OUT/verl_$b.log" | cut -c1-300 | tail -8
  python3 - "$OUT/verl_$b.log" <<'EOF'
import re, sys
keep = ("timing_s/", "timing_per_token_ms/", "perf/throughput", "perf/time_per_step", "perf/total_num_tokens",
        "response_length/mean", "response_length/clip_ratio", "critic/score/mean", "perf/max_memory_allocated_gb",
        "perf/max_memory_reserved_gb", "perf/cpu_memory_used_gb")
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
