# Sourced by the GPU session scripts: one GRPO run through `python -m megarl.main_ppo` on the demo task's data.
#   run_e2e NAME MODEL_DIR GPUS LIMIT_S [overrides...]
#   plan_e2e NAME MODEL_DIR GPUS [overrides...]      (the launch plan of the same command, python -m megarl.plan)
# The model directory is a random policy with the demo tokenizer (benchmarks/grpo_model_dir.py); the data
# {train,val}.parquet of E2E_DATA (default /tmp/gpu-demo, the demo task); logs, the
# metrics and their per-step summary (benchmarks/summarize_metrics.py) go to $OUT/NAME.*.
e2e_common() {  # $1 model dir, $2 GPUs, $3 run directory (one per run: runs of a queue may go side by side)
  echo actor_rollout_ref.model.path="$1" trainer.device=cuda trainer.n_gpus_per_node="$2" \
    data.train_files="${E2E_DATA:-/tmp/gpu-demo}/train.parquet" data.val_files="${E2E_DATA:-/tmp/gpu-demo}/val.parquet" \
    trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=-1 algorithm.adv_estimator=grpo \
    trainer.logger=[console] trainer.default_local_dir="$3" ray_kwargs.ray_init.num_cpus=8 \
    actor_rollout_ref.rollout.calculate_log_probs=true \
    actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend=auto
}

run_e2e() {
  local name=$1 model=$2 gpus=$3 limit=$4 dir=/tmp/e2e_run.$1
  shift 4
  rm -rf "$dir"
  # shellcheck disable=SC2046
  timeout "$limit" python3 -m megarl.main_ppo $(e2e_common "$model" "$gpus" "$dir") "$@" > "$OUT/$name.log" 2>&1
  echo rc $?
  cp "$dir/metrics.jsonl" "$OUT/$name.metrics.jsonl" 2>/dev/null
  grep -iE "layer spec|weight sync into|memory plan|non-finite|Traceback|Error|step [0-9]+/" "$OUT/$name.log" | cut -c1-300 | tail -12
  [ -f "$OUT/$name.metrics.jsonl" ] && python3 benchmarks/summarize_metrics.py "$OUT/$name.metrics.jsonl" --gpus "$gpus"
}

plan_e2e() {
  local name=$1 model=$2 gpus=$3
  shift 3
  # shellcheck disable=SC2046
  python3 -m megarl.plan $(e2e_common "$model" "$gpus" "/tmp/e2e_run.$name") "$@" > "$OUT/$name.plan.txt" 2>&1
  echo plan rc $?; grep -A12 "^peak per phase" "$OUT/$name.plan.txt"
}
