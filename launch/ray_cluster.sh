#!/usr/bin/env bash
# Multi-node megarl on Ray: start the head, join the workers, submit the trainer.
#
#   launch/ray_cluster.sh head                   # on the head node
#   launch/ray_cluster.sh worker <head_ip>       # on every other node
#   launch/ray_cluster.sh wait <nnodes> [ip...]  # until the nodes joined (bounded; names the missing)
#   launch/ray_cluster.sh submit [overrides]     # on the head: waits for trainer.nnodes nodes, runs the trainer
#   launch/ray_cluster.sh stop                   # on every node: stops the Ray node(s) this script started here
#
# Two-node example (2 x 8 H100), Qwen2.5-7B, actor TP=4, vLLM TP=2:
#   node0$ NODE_IP=10.0.0.1 launch/ray_cluster.sh head
#   node1$ NODE_IP=10.0.0.2 launch/ray_cluster.sh worker 10.0.0.1
#   node0$ launch/ray_cluster.sh submit \
#            trainer.nnodes=2 trainer.n_gpus_per_node=8 \
#            actor_rollout_ref.model.path=/models/Qwen2.5-7B-Instruct \
#            actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4 \
#            actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
#            data.train_files=/data/gsm8k/train.parquet data.val_files=/data/gsm8k/test.parquet
#
# Environment: RAY_PORT (6379), NODE_IP (this node's address; default: Ray's choice; Ray
# replaces 127.0.0.1 by the host's address, other loopback addresses are kept),
# RAY_TEMP_DIR (/tmp/ray), GPUS_PER_NODE / CPUS_PER_NODE (default: what Ray detects, so CPU
# nodes work), WAIT_TIMEOUT_S (300: how long head/worker/submit wait for nodes),
# EXPECT_NODES (wait / submit: "[name=]ip ..." of the nodes that must join; a missing one is
# named), RAY_NODE_ARGS (more `ray start` flags, e.g. ports when several nodes share one host).
#
# The cluster's token (Ray's token authentication, on here): `head` uses RAY_AUTH_TOKEN if set,
# else ~/.ray/auth_token (made if missing, mode 600) and prints where it is. Every worker node and the
# submitting shell need the same token: either
#   1. copy the head's ~/.ray/auth_token to ~/.ray/auth_token on each node (a shared home has it), or
#   2. export RAY_AUTH_TOKEN=<its contents> before `worker` / `submit` on each node.
# `worker` refuses to start without one.
#
# Each node runs `ray start --block` in its own process group (pid in
# $RAY_TEMP_DIR/megarl-launch/); `stop` ends exactly those processes (never `ray stop`,
# which would stop every Ray node of this user on the machine). The trainer (driver) runs
# on the head and places one worker per GPU on every node through Ray placement groups.
# Paths (model, data, trainer.default_local_dir) must be visible on every node.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
PYTHON="${PYTHON:-python}"
RAY="${RAY:-ray}"
RAY_PORT="${RAY_PORT:-6379}"
RAY_TEMP_DIR="${RAY_TEMP_DIR:-/tmp/ray}"
WAIT_TIMEOUT_S="${WAIT_TIMEOUT_S:-300}"
PID_DIR="${RAY_TEMP_DIR}/megarl-launch"
# `ray start` enables token authentication, the Python client only when told: say it to both.
# Every node and the driver need the same token (~/.ray/auth_token or RAY_AUTH_TOKEN).
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"

node_args() {
  local args=()
  [ -n "${NODE_IP:-}" ] && args+=(--node-ip-address="${NODE_IP}")
  [ -n "${GPUS_PER_NODE:-}" ] && args+=(--num-gpus="${GPUS_PER_NODE}")
  [ -n "${CPUS_PER_NODE:-}" ] && args+=(--num-cpus="${CPUS_PER_NODE}")
  # shellcheck disable=SC2206
  args+=(${RAY_NODE_ARGS:-})
  echo "${args[@]}"
}

# start_node <name> <head_address> <ray start flags...>: `ray start --block` in its own process
# group, then wait (bounded) until this node is alive in the cluster.
start_node() {
  local name=$1 address=$2; shift 2
  mkdir -p "${PID_DIR}"
  local log="${PID_DIR}/${name}.log"
  setsid "${RAY}" start --block --temp-dir="${RAY_TEMP_DIR}" "$@" >"${log}" 2>&1 < /dev/null &
  local pid=$!
  echo "${pid}" > "${PID_DIR}/${name}.pid"
  local expect=()
  [ -n "${NODE_IP:-}" ] && expect=(--expect "${NODE_IP}")
  local deadline=$((SECONDS + WAIT_TIMEOUT_S))
  until "${PYTHON}" "${HERE}/wait_nodes.py" --address "${address}" --nodes 1 "${expect[@]}" --timeout 5 >/dev/null 2>&1; do
    if ! kill -0 "${pid}" 2>/dev/null; then
      echo "megarl launch: ray start (${name}) exited; its log ${log}:" >&2; tail -20 "${log}" >&2; exit 1
    fi
    if [ "${SECONDS}" -ge "${deadline}" ]; then
      echo "megarl launch: node ${name} (${NODE_IP:-this host}) not alive in ${address} after ${WAIT_TIMEOUT_S} s; log ${log}" >&2
      stop_nodes; exit 1
    fi
    sleep 1
  done
  echo "megarl launch: ${name} node up (${NODE_IP:-this host}), cluster ${address}, pid ${pid}, log ${log}"
}

token_file() { echo "${RAY_AUTH_TOKEN_PATH:-${HOME}/.ray/auth_token}"; }

require_token() {  # the node needs the cluster's token before it can join
  [ "${RAY_AUTH_MODE}" = "token" ] || return 0
  [ -n "${RAY_AUTH_TOKEN:-}" ] && return 0
  [ -s "$(token_file)" ] && return 0
  echo "megarl launch: no Ray token on this node (RAY_AUTH_TOKEN unset, $(token_file) missing): copy the head's" \
       "~/.ray/auth_token to $(token_file), or export RAY_AUTH_TOKEN=<its contents>, then run this again" >&2
  exit 2
}

stop_nodes() {
  shopt -s nullglob
  for f in "${PID_DIR}"/*.pid; do
    local pid; pid=$(cat "$f")
    if kill -0 "${pid}" 2>/dev/null; then
      kill -TERM "${pid}" 2>/dev/null || true  # ray start --block drains its node, then stops its processes
      for _ in $(seq 45); do kill -0 "${pid}" 2>/dev/null || break; sleep 1; done
    fi
    kill -KILL -- "-${pid}" 2>/dev/null || true  # whatever is left of its process group
    rm -f "$f"
    echo "megarl launch: stopped $(basename "$f" .pid) (pid ${pid})"
  done
}

nnodes_of() {  # trainer.nnodes=N among the overrides (default 1)
  local n=1 a
  for a in "$@"; do case "$a" in trainer.nnodes=*) n="${a#trainer.nnodes=}";; esac; done
  echo "$n"
}

case "${1:-}" in
  head)
    if [ "${RAY_AUTH_MODE}" = "token" ] && [ -z "${RAY_AUTH_TOKEN:-}" ] && [ ! -s "$(token_file)" ]; then
      mkdir -p "$(dirname "$(token_file)")"
      (umask 077; "${PYTHON}" -c 'import secrets; print(secrets.token_hex(32))' > "$(token_file)")
      echo "megarl launch: made this cluster's Ray token: $(token_file)"
    fi
    # shellcheck disable=SC2046
    start_node head "${NODE_IP:-127.0.0.1}:${RAY_PORT}" --head --port="${RAY_PORT}" --include-dashboard=false $(node_args)
    if [ "${RAY_AUTH_MODE}" = "token" ] && [ -z "${RAY_AUTH_TOKEN:-}" ]; then
      echo "megarl launch: worker nodes need this cluster's token: copy $(token_file) to each node's" \
           "~/.ray/auth_token, or export RAY_AUTH_TOKEN=\$(cat $(token_file)) there"
    fi
    ;;
  worker)
    head_ip="${2:?usage: $0 worker <head_ip>}"
    require_token
    # shellcheck disable=SC2046
    start_node "worker-${NODE_IP:-$(hostname)}" "${head_ip}:${RAY_PORT}" --address="${head_ip}:${RAY_PORT}" $(node_args)
    ;;
  wait)
    shift
    n="${1:?usage: $0 wait <nnodes> [node_ip ...]}"; shift
    # shellcheck disable=SC2086
    exec "${PYTHON}" "${HERE}/wait_nodes.py" --address "${RAY_ADDRESS:-${NODE_IP:-127.0.0.1}:${RAY_PORT}}" \
      --nodes "$n" --expect "$@" ${EXPECT_NODES:-} --timeout "${WAIT_TIMEOUT_S}"
    ;;
  submit)
    shift
    # RAY_ADDRESS makes megarl.trainer.run_ppo join this cluster instead of starting a local one.
    export RAY_ADDRESS="${RAY_ADDRESS:-${NODE_IP:-127.0.0.1}:${RAY_PORT}}"
    require_token
    # shellcheck disable=SC2086
    "${PYTHON}" "${HERE}/wait_nodes.py" --address "${RAY_ADDRESS}" --nodes "$(nnodes_of "$@")" \
      --expect ${EXPECT_NODES:-} --timeout "${WAIT_TIMEOUT_S}"
    exec "${PYTHON}" -m megarl.main_ppo --config-name=ppo_megatron_trainer "$@"
    ;;
  stop)
    stop_nodes
    ;;
  *)
    sed -n '2,18p' "$0"
    exit 2
    ;;
esac
