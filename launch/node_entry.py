"""One process per node under torchrun (launch/torchrun_multinode.sh): bring up Ray, then
run the trainer on node 0 while the other nodes serve as Ray workers until it finishes.

torchrun's env (RANK = node rank, WORLD_SIZE = nodes, MASTER_ADDR) is used for a gloo
barrier only; the trainer's own worker processes get their distributed env from Ray.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import time

RAY_PORT = int(os.environ.get("RAY_PORT", "6379"))


def _ray(*args: str) -> None:
    subprocess.run(["ray", *args], check=True)


def main() -> int:
    import torch.distributed as dist

    node_rank = int(os.environ["RANK"])
    head = os.environ["MEGARL_RAY_HEAD"]
    gpus = os.environ["MEGARL_GPUS_PER_NODE"]
    dist.init_process_group("gloo", timeout=datetime.timedelta(hours=72))
    if node_rank == 0:
        _ray("start", "--head", f"--port={RAY_PORT}", f"--num-gpus={gpus}")
    dist.barrier()  # head is up
    if node_rank != 0:
        _ray("start", f"--address={head}:{RAY_PORT}", f"--num-gpus={gpus}")
    dist.barrier()  # every node joined
    code = 0
    if node_rank == 0:
        env = {**os.environ, "RAY_ADDRESS": f"127.0.0.1:{RAY_PORT}"}
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(key, None)  # the trainer's workers get theirs from Ray
        overrides = [f"trainer.nnodes={os.environ['MEGARL_NNODES']}", f"trainer.n_gpus_per_node={gpus}", *sys.argv[1:]]
        code = subprocess.call([sys.executable, "-m", "megarl.main_ppo", "--config-name=ppo_megatron_trainer", *overrides],
                               env=env)
    dist.barrier()  # workers stay in the cluster until the trainer is done
    time.sleep(1)
    _ray("stop")
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
