"""WorkerGroup on a local Ray with CPU bundles: rank environment, fail-fast errors, timeouts."""

import os
import time

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def group():
    import ray

    from megarl.trainer.resources import create_resource_pool
    from megarl.trainer.worker_group import WorkerGroup

    here = os.path.dirname(os.path.abspath(__file__))
    # Ray starts as on a node whose launcher exposed GPUs 2 and 3 (CUDA_VISIBLE_DEVICES=2,3): Ray then
    # names them "2" and "3" while torch in its workers numbers them 0 and 1.
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = "2,3"
    try:
        ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": here}})
    finally:
        if saved is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved
    pool = create_resource_pool(1, 2, use_gpu=False, cpus_per_slot=0.5)
    wg = WorkerGroup("toy", "toy_worker:ToyWorker", ("T",), {}, pool.placements, 0.25, 0.0,
                     env={"OMP_NUM_THREADS": "1"}, call_timeout_s=120)
    yield wg
    wg.shutdown()
    pool.release()
    ray.shutdown()


def test_ranks_get_distributed_env(group):
    envs = group.call_all("env")
    assert [e["RANK"] for e in envs] == ["0", "1"]
    assert {e["WORLD_SIZE"] for e in envs} == {"2"}
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1 and envs[0]["MASTER_PORT"]
    assert envs[1]["OMP_NUM_THREADS"] == "1"


def test_gpu_ranks_get_the_cuda_ordinal_of_their_ray_gpu(group):
    """Ranks with a GPU each: LOCAL_RANK is the torch ordinal (0, 1) of the GPU Ray assigned ("2", "3"),
    with every GPU left visible (the 2026-11-27 device run on GPUs 2-3 died with "invalid device ordinal")."""
    from megarl.trainer.resources import create_resource_pool
    from megarl.trainer.worker_group import WorkerGroup

    pool = create_resource_pool(1, 2, use_gpu=True, cpus_per_slot=0.25)
    wg = WorkerGroup("toy_gpu", "toy_worker:ToyWorker", ("G",), {}, pool.placements, 0.25, 1.0, call_timeout_s=120)
    try:
        envs = wg.call_all("env")
    finally:
        wg.shutdown()
        pool.release()
    assert {e["CUDA_VISIBLE_DEVICES"] for e in envs} == {"2,3"}
    assert sorted(e["LOCAL_RANK"] for e in envs) == ["0", "1"]


def test_rank0_holds_the_master_port_until_the_group_forms(group):
    """The rendezvous port is listened on from the moment it is chosen: a port picked free and closed again
    was taken by another socket in CI before torch bound it (EADDRINUSE at init_workers)."""
    assert group.call_all("master_port_taken") == [True, True]
    assert group.call_all("all_reduce_rank") == [1, 1]


def test_failing_rank_stops_the_call_with_its_traceback(group):
    from megarl.trainer.worker_group import WorkerError

    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        group.call_all("fail_on", 1, 60.0)
    assert time.monotonic() - start < 30  # did not wait for the healthy rank
    message = str(info.value)
    assert "toy.fail_on" in message and "rank 1" in message
    assert "ArithmeticError: toy failure in T" in message and "toy_worker.py" in message


def test_hung_call_times_out(group):
    from megarl.trainer.worker_group import WorkerError

    group.call_timeout_s = 2
    try:
        with pytest.raises(WorkerError, match="2 of 2 ranks did not finish within 2 s"):
            group.call_all("fail_on", -1, 5.0)
    finally:
        group.call_timeout_s = 120


@pytest.mark.extended  # ~60 s on 2 cores: both toy ranks import torch and tensordict for it
def test_call_dp_sends_each_chunk_once_and_collects_one_rank_per_group(group):
    """TP=2 over the 2 ranks: one DP group, both ranks run on the same rows, only the
    output rank (TP rank 0) sends its result back; the rows come back in order."""
    import torch

    from megarl.parallel.layout import ParallelLayout
    from megarl.protocol import DataProto

    values = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    before = group.call_all("call_count")
    group.layout = ParallelLayout(world_size=2, tp=2)
    try:
        out = group.call_dp("row_sums", DataProto.from_dict({"values": values}))
    finally:
        group.layout = None
    assert torch.equal(out.batch["sums"], values.sum(-1))  # all rows, in order, from one rank
    assert out.batch["rank"].tolist() == [0.0] * 6
    assert [a - b for a, b in zip(group.call_all("call_count"), before)] == [1, 1]  # both TP ranks ran


def test_dead_worker_process_is_named_with_rank_and_pid(group):
    """Last in this module: it leaves rank 1 dead."""
    from megarl.trainer.worker_group import WorkerError

    assert len(group.pids) == 2 and all(isinstance(p, int) for p in group.pids)
    with pytest.raises(WorkerError) as info:
        group.call_all("die_on", 1, 60.0)  # hang guard: the healthy rank would return after 60 s
    message = str(info.value)
    node_id, ip = group.nodes[1]
    assert f"toy rank 1 (pid {group.pids[1]}, on node {node_id} ({ip})): the worker process died during toy.die_on" in message
    assert "ActorDiedError" in message
