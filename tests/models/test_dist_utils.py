"""tests/helpers/dist_utils.run_distributed: results by rank, errors carry the rank's traceback."""

import pytest
import torch
import torch.distributed as dist
from helpers.dist_utils import DistributedTestError, run_distributed


def _all_reduce_rank(scale: int) -> float:
    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank() + 1) * scale])
    dist.all_reduce(value)
    return value.item()


def _raise_on_rank_one() -> None:
    import os

    if os.environ["RANK"] == "1":
        raise ValueError("boom from rank 1")


@pytest.mark.slow
def test_run_distributed_returns_per_rank_results():
    assert run_distributed(_all_reduce_rank, 2, 10, timeout=60) == [30.0, 30.0]


@pytest.mark.slow
def test_run_distributed_reraises_rank_error():
    with pytest.raises(DistributedTestError, match="boom from rank 1") as info:
        run_distributed(_raise_on_rank_one, 2, timeout=60)
    assert isinstance(info.value.__cause__, ValueError)


@pytest.mark.slow
def test_run_distributed_starts_again_when_the_port_is_taken(monkeypatch):
    """The port chosen for a job can be taken by another socket before rank 0 listens on it: the job
    starts again on another port instead of failing the test."""
    import socket

    import helpers.dist_utils as dist_utils

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = iter([taken.getsockname()[1]])
        real = dist_utils.free_port
        monkeypatch.setattr(dist_utils, "free_port", lambda: next(ports, None) or real())
        assert run_distributed(_all_reduce_rank, 2, 10, timeout=60) == [30.0, 30.0]
