#!/usr/bin/env bash
# Multi-node megarl on Ray: start the head, join the workers, submit the trainer.
#
#   launch/ray_cluster.sh head                 # on the head node
#   launch/ray_cluster.sh worker <head_ip>     # on every other node
#   launch/ray_cluster.sh submit [overrides]   # on the head node, once all nodes joined
#   launch/ray_cluster.sh stop                 # on every node
#
# Two-node example (2 x 8 H100), Qwen2.5-7B, actor TP=4, vLLM TP=2:
#   node0$ launch/ray_cluster.sh head
#   node1$ launch/ray_cluster.sh worker 10.0.0.1
#   node0$ launch/ray_cluster.sh submit \
#            trainer.nnodes=2 trainer.n_gpus_per_node=8 \
#            actor_rollout_ref.model.path=/models/Qwen2.5-7B-Instruct \
#            actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4 \
#            actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
#            data.train_files=/data/gsm8k/train.parquet data.val_files=/data/gsm8k/test.parquet
#
# The trainer (driver) runs on the head node and places one worker per GPU on every node
# through Ray placement groups; nothing else needs to run on the workers. Paths (model,
# data, trainer.default_local_dir) must be visible on every node (shared filesystem).
set -euo pipefail

RAY_PORT="${RAY_PORT:-6379}"
DASHBOARD_PORT="${DASHBOARD_PORT:-8265}"
GPUS_PER_NODE="${GPUS_PER_NODE:-$(nvidia-smi -L 2>/dev/null | wc -l)}"

case "${1:-}" in
  head)
    ray start --head --port="${RAY_PORT}" --dashboard-host=0.0.0.0 --dashboard-port="${DASHBOARD_PORT}" \
      --num-gpus="${GPUS_PER_NODE}"
    ;;
  worker)
    head_ip="${2:?usage: $0 worker <head_ip>}"
    ray start --address="${head_ip}:${RAY_PORT}" --num-gpus="${GPUS_PER_NODE}"
    ;;
  submit)
    shift
    # RAY_ADDRESS makes megarl.trainer.run_ppo join this cluster instead of starting a local one.
    export RAY_ADDRESS="${RAY_ADDRESS:-127.0.0.1:${RAY_PORT}}"
    ray status
    exec python -m megarl.main_ppo --config-name=ppo_megatron_trainer "$@"
    ;;
  stop)
    ray stop
    ;;
  *)
    sed -n '2,12p' "$0"
    exit 2
    ;;
esac
