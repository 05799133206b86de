#!/usr/bin/env bash
# Multi-node megarl without a pre-started Ray cluster, launched by torchrun (one launcher
# process per node). torchrun's rendezvous brings the nodes up together: node rank 0 starts
# the Ray head (launch/ray_cluster.sh head) and runs the trainer; the other nodes join Ray
# (ray_cluster.sh worker) and wait until the trainer finishes. The trainer then places the
# Megatron/vLLM workers (one per GPU) on all nodes through Ray, as in launch/ray_cluster.sh.
#
# Two-node example (2 x 8 H100); run on both nodes, MASTER_ADDR = node 0:
#   node0$ NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 NODE_IP=10.0.0.1 launch/torchrun_multinode.sh \
#            trainer.n_gpus_per_node=8 actor_rollout_ref.model.path=/models/Qwen2.5-7B-Instruct \
#            actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4 \
#            data.train_files=/data/gsm8k/train.parquet data.val_files=/data/gsm8k/test.parquet
#   node1$ NNODES=2 NODE_RANK=1 MASTER_ADDR=10.0.0.1 NODE_IP=10.0.0.2 launch/torchrun_multinode.sh <same overrides>
#
# Environment: NNODES, NODE_RANK, MASTER_ADDR (required), MASTER_PORT (29500), RAY_PORT,
# NODE_IP, RAY_TEMP_DIR, WAIT_TIMEOUT_S, ... as for launch/ray_cluster.sh. GPUS_PER_NODE, if
# set, becomes trainer.n_gpus_per_node; Ray detects each node's GPUs (CPU nodes work).
set -euo pipefail

NNODES="${NNODES:?set NNODES}"
NODE_RANK="${NODE_RANK:?set NODE_RANK}"
MASTER_ADDR="${MASTER_ADDR:?set MASTER_ADDR (node 0)}"
MASTER_PORT="${MASTER_PORT:-29500}"
export MEGARL_GPUS_PER_NODE="${GPUS_PER_NODE:-}" MEGARL_RAY_HEAD="${MASTER_ADDR}"

exec torchrun --nnodes="${NNODES}" --node_rank="${NODE_RANK}" --nproc_per_node=1 \
  --master_addr="${MASTER_ADDR}" --master_port="${MASTER_PORT}" \
  "$(dirname "$0")/node_entry.py" "$@"
