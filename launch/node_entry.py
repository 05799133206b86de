"""One process per node under torchrun (launch/torchrun_multinode.sh): bring up Ray with
launch/ray_cluster.sh, run the trainer on node 0 while the other nodes serve as Ray workers
until it finishes, then stop this node's Ray.

torchrun's env (RANK = node rank, WORLD_SIZE = nodes, MASTER_ADDR) is used for a gloo group
only (barriers); the trainer's own worker processes get their distributed env from Ray.
Waits are bounded (WAIT_TIMEOUT_S, the error names the missing node); a node that dies
ends the others' barrier with an error; SIGTERM (torchrun forwards it) stops the trainer
and this node's Ray, and the process exits 143.
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CLUSTER = str(HERE / "ray_cluster.sh")
TRAINER_TIMEOUT = datetime.timedelta(hours=72)  # the last barrier waits for the whole run
TORCHRUN_VARS = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
                 "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT"}


def _cluster(*args: str) -> None:
    subprocess.run([CLUSTER, *args], check=True)


def main() -> int:
    import torch.distributed as dist

    from megarl.parallel.net_iface import use_route_to_master

    node_rank, nnodes = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    head = os.environ["MEGARL_RAY_HEAD"]
    port = os.environ.setdefault("RAY_PORT", "6379")
    wait_s = float(os.environ.setdefault("WAIT_TIMEOUT_S", "300"))
    os.environ.setdefault("PYTHON", sys.executable)
    trainer: subprocess.Popen | None = None

    def on_sigterm(signum, frame):  # torchrun (or Slurm through it) stops the job
        if trainer is not None and trainer.poll() is None:
            trainer.terminate()
            try:
                trainer.wait(timeout=60)
            except subprocess.TimeoutExpired:
                trainer.kill()
        subprocess.run([CLUSTER, "stop"], check=False)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    chosen = use_route_to_master()  # gloo on the interface that reaches MASTER_ADDR, not the host name's loopback
    dist.init_process_group("gloo", timeout=TRAINER_TIMEOUT)
    # torchrun's variables must not reach Ray's processes: under TORCHELASTIC_USE_AGENT_STORE
    # the trainer's worker ranks would wait for a rendezvous store that nobody serves.
    # Nor the interface chosen for torchrun's master: the trainer's ranks choose for their own.
    for key in [k for k in os.environ if k.startswith("TORCHELASTIC_") or k in TORCHRUN_VARS or k in chosen]:
        del os.environ[key]
    start_wait = datetime.timedelta(seconds=wait_s)  # monitored: the error names the rank (node) that is missing
    code = 0
    try:
        if node_rank == 0:
            _cluster("head")
        dist.monitored_barrier(timeout=start_wait)  # the head is up
        if node_rank != 0:
            _cluster("worker", head)
        dist.monitored_barrier(timeout=start_wait)  # every node started its Ray node
        if node_rank == 0:
            env = {**os.environ, "RAY_ADDRESS": f"{os.environ.get('NODE_IP', head)}:{port}"}
            overrides = [f"trainer.nnodes={nnodes}"]
            if os.environ.get("MEGARL_GPUS_PER_NODE"):
                overrides.append(f"trainer.n_gpus_per_node={os.environ['MEGARL_GPUS_PER_NODE']}")
            # ray_cluster.sh submit waits (bounded) for the nodes, then runs the trainer
            trainer = subprocess.Popen([CLUSTER, "submit", *overrides, *sys.argv[1:]], env=env)
            code = trainer.wait()
        # Workers stay in the cluster until the trainer is done (a long wait: the whole run).
        dist.barrier()
    finally:
        subprocess.run([CLUSTER, "stop"], check=False)
        dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
