#!/usr/bin/env bash
# A two-node Slurm cluster on this one machine, to try launch/slurm_megarl.sbatch without a
# real cluster: munged, slurmctld and two slurmd daemons (`slurmd -N n1`, `slurmd -N n2`).
# By default n1 is 127.0.0.1 and n2 127.0.0.2 (two addresses, one network); with NODE_NETNS
# each node runs in its own network namespace (e.g. two joined by a veth pair, like two
# machines: loopback does not reach the other node), slurmctld in n1's. Needs root and
# Debian's slurm-wlm + munge (apt-get install slurm-wlm munge). Everything lives in LOCAL_SLURM_DIR.
#
#   launch/local_slurm/up.sh                  # prints the SLURM_CONF to export
#   export SLURM_CONF=/tmp/megarl-slurm/slurm.conf
#   sbatch --nodes=2 --wait launch/slurm_megarl.sbatch trainer.device=cpu ...
#   launch/local_slurm/down.sh
#
# Environment: LOCAL_SLURM_DIR (/tmp/megarl-slurm), SLURM_BASE_PORT (26817: controller; the
# two slurmd use the next two ports), NODE_CPUS (2 per node), UP_TIMEOUT_S (60),
# NODE_ADDRS ("127.0.0.1 127.0.0.2": n1's and n2's addresses), NODE_NETNS ("": the network
# namespaces n1 and n2 run in; then run sbatch, squeue, scancel in n1's: nsenter --net=/run/netns/<ns> ...).
set -euo pipefail

D="${LOCAL_SLURM_DIR:-/tmp/megarl-slurm}"
PORT="${SLURM_BASE_PORT:-26817}"
CPUS="${NODE_CPUS:-2}"
UP_TIMEOUT_S="${UP_TIMEOUT_S:-60}"
HOST="$(hostname -s)"
read -r ADDR1 ADDR2 <<< "${NODE_ADDRS:-127.0.0.1 127.0.0.2}"
read -r NS1 NS2 <<< "${NODE_NETNS:-}"
in_ns() {  # in_ns <namespace or ""> <command...>: the network namespace only (`ip netns exec` remounts
  local ns=$1; shift  # /sys, hiding the cgroup mounts slurmd needs)
  if [ -n "${ns}" ]; then nsenter --net="/run/netns/${ns}" "$@"; else "$@"; fi
}
mkdir -p "$D"/state "$D"/spool
chmod 755 "$D"

# munge: our own key, socket and pid file (the system's munged, if any, is left alone)
if [ ! -f "$D/munge.key" ]; then
  dd if=/dev/urandom of="$D/munge.key" bs=1024 count=1 status=none
  chmod 400 "$D/munge.key"
fi
munged --force --key-file="$D/munge.key" --socket="$D/munge.sock" --pid-file="$D/munged.pid" \
  --log-file="$D/munged.log" --seed-file="$D/munged.seed"

cat > "$D/slurm.conf" <<CONF
ClusterName=megarl-local
SlurmctldHost=${HOST}(${ADDR1})
SlurmctldPort=${PORT}
AuthType=auth/munge
AuthInfo=socket=$D/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd-%n.pid
SlurmctldLogFile=$D/slurmctld.log
SlurmdLogFile=$D/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
KillWait=30
SlurmctldTimeout=60
SlurmdTimeout=60
NodeName=n1 NodeAddr=${ADDR1} NodeHostname=${HOST} Port=$((PORT + 1)) CPUs=${CPUS} State=UNKNOWN
NodeName=n2 NodeAddr=${ADDR2} NodeHostname=${HOST} Port=$((PORT + 2)) CPUs=${CPUS} State=UNKNOWN
PartitionName=local Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
CONF

export SLURM_CONF="$D/slurm.conf"
in_ns "${NS1}" slurmctld -f "$SLURM_CONF"
in_ns "${NS1}" slurmd -f "$SLURM_CONF" -N n1
in_ns "${NS2}" slurmd -f "$SLURM_CONF" -N n2

deadline=$((SECONDS + UP_TIMEOUT_S))
until [ "$(in_ns "${NS1}" sinfo -h -N -o '%N %t' 2>/dev/null | grep -cE ' (idle|mix|alloc)$')" -ge 2 ]; do
  if [ "${SECONDS}" -ge "${deadline}" ]; then
    echo "local slurm: nodes not idle after ${UP_TIMEOUT_S} s:" >&2
    in_ns "${NS1}" sinfo -N >&2 || true
    tail -5 "$D"/slurmctld.log "$D"/slurmd-n*.log >&2 || true
    exit 1
  fi
  sleep 1
done
in_ns "${NS1}" sinfo -N
echo "export SLURM_CONF=$SLURM_CONF"
