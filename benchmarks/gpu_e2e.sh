# Sourced by the GPU session scripts: one GRPO run through `python -m megarl.main_ppo` on the demo task's data.
#   run_e2e NAME MODEL_DIR GPUS LIMIT_S [overrides...]
# The model directory is a random policy with the demo tokenizer (benchmarks/grpo_model_dir.py); logs, the
# metrics and their per-step summary (benchmarks/summarize_metrics.py) go to $OUT/NAME.*.
run_e2e() {
  local name=$1 model=$2 gpus=$3 limit=$4
  shift 4
  rm -rf /tmp/e2e_run
  timeout "$limit" python3 -m megarl.main_ppo actor_rollout_ref.model.path="$model" trainer.device=cuda \
    trainer.n_gpus_per_node="$gpus" data.train_files=/tmp/gpu-demo/train.parquet data.val_files=/tmp/gpu-demo/val.parquet \
    trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=-1 algorithm.adv_estimator=grpo \
    trainer.logger=[console] trainer.default_local_dir=/tmp/e2e_run ray_kwargs.ray_init.num_cpus=8 \
    actor_rollout_ref.rollout.calculate_log_probs=true \
    actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend=auto "$@" > "$OUT/$name.log" 2>&1
  echo rc $?
  cp /tmp/e2e_run/metrics.jsonl "$OUT/$name.metrics.jsonl" 2>/dev/null
  grep -iE "layer spec|weight sync into|non-finite|Traceback|Error|step [0-9]+/" "$OUT/$name.log" | cut -c1-300 | tail -12
  [ -f "$OUT/$name.metrics.jsonl" ] && python3 benchmarks/summarize_metrics.py "$OUT/$name.metrics.jsonl" --gpus "$gpus"
}
