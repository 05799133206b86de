#!/usr/bin/env bash
# Stop the local two-node Slurm cluster of launch/local_slurm/up.sh: cancel its jobs, stop
# its two slurmd, slurmctld and munged (by their pid files; nothing else is touched).
set -uo pipefail

D="${LOCAL_SLURM_DIR:-/tmp/megarl-slurm}"
export SLURM_CONF="$D/slurm.conf"
read -r NS1 _ <<< "${NODE_NETNS:-}"
if [ -f "$SLURM_CONF" ]; then
  if [ -n "${NS1}" ]; then nsenter --net="/run/netns/${NS1}" scancel --full --quiet --partition=local 2>/dev/null
  else scancel --full --quiet --partition=local 2>/dev/null; fi
fi
stop() {  # stop <pidfile>: SIGTERM, wait up to 30 s, then SIGKILL
  local f=$1 pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if kill -TERM "$pid" 2>/dev/null; then
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -KILL "$pid" 2>/dev/null
  fi
  rm -f "$f"
}
stop "$D/slurmd-n1.pid"
stop "$D/slurmd-n2.pid"
stop "$D/slurmctld.pid"
stop "$D/munged.pid"
echo "local slurm: stopped (state in $D)"
