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
