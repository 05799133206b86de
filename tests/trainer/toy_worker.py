"""A plain worker for the WorkerGroup tests (imported by the Ray worker processes)."""

import os
import signal
import time


class ToyWorker:
    def __init__(self, tag: str) -> None:
        self.tag = tag

    def env(self) -> dict:
        return {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS",
                                         "LOCAL_RANK", "CUDA_VISIBLE_DEVICES")}

    def fail_on(self, bad_rank: int, sleep_s: float) -> str:
        if int(os.environ["RANK"]) == bad_rank:
            raise ArithmeticError(f"toy failure in {self.tag}")
        time.sleep(sleep_s)  # the healthy ranks would block in a collective
        return "ok"

    def die_on(self, bad_rank: int, sleep_s: float) -> str:
        if int(os.environ["RANK"]) == bad_rank:
            os.kill(os.getpid(), signal.SIGKILL)  # the process dies, as on an OOM kill
        time.sleep(sleep_s)
        return "ok"

    def row_sums(self, data) -> "object":
        """``[B]`` sum of each row's ``values`` (a DataProto back, like a log-prob pass); counts calls."""
        from megarl.protocol import DataProto

        self.calls = getattr(self, "calls", 0) + 1
        return DataProto.from_dict({"sums": data.batch["values"].sum(-1), "rank": data.batch["values"][:, 0] * 0
                                    + int(os.environ["RANK"])})

    def call_count(self) -> int:
        return getattr(self, "calls", 0)

    def master_port_taken(self) -> bool:
        """Whether another socket could bind this group's MASTER_PORT now (it must not: rank 0 listens on
        it from the moment it was chosen, or any other socket of the machine may take it first)."""
        import socket

        with socket.socket() as probe:
            try:
                probe.bind(("", int(os.environ["MASTER_PORT"])))
            except OSError:
                return True
        return False

    def all_reduce_rank(self) -> int:
        """The group's torch.distributed world formed through megarl's rendezvous: the sum of the ranks."""
        import torch
        import torch.distributed as dist

        from megarl.parallel import init_distributed

        init_distributed({}, "cpu", seed=0)
        value = torch.tensor([int(os.environ["RANK"])])
        dist.all_reduce(value)
        return int(value.item())
