"""Rank bodies for the weight-push group test: each process has its own default world (as the
trainer's rank 0 and each standalone engine do) and joins a group outside it."""

from __future__ import annotations

import os


def push_across_worlds(tmp: str, integrity_check: bool) -> dict:
    import torch
    import torch.distributed as dist

    from transport_body import _tensors

    from megarl.weight_sync import SyncStats, WeightSyncIntegrityError, build_plan, stream_broadcast
    from megarl.weight_sync.sync_group import SyncGroup

    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=f"file://{tmp}/own_world_{rank}", rank=0, world_size=1)
    group = SyncGroup("127.0.0.1", int(os.environ["MASTER_PORT"]), rank, size, "gloo", timeout_s=60)
    src = _tensors()
    plan = build_plan([(n, t.shape, t.dtype) for n, t in src.items()], bucket_size_bytes=30_000)
    if rank == 2:  # this receiver's copy of bucket 1 is damaged on arrival
        real = group.broadcast
        calls = {"n": 0}

        def flaky(tensor, root):
            real(tensor, root)
            calls["n"] += 1
            if calls["n"] == 4:  # header, bucket 0, header, bucket 1
                tensor[100] ^= 1

        group.broadcast = flaky
    stats = SyncStats()
    try:
        got = {n: t.clone() for n, t in stream_broadcast(src.items() if rank == 0 else None, plan, src=0, group=group,
                                                           integrity_check=integrity_check, stats=stats)}
    except WeightSyncIntegrityError as err:
        return {"error_bucket": err.bucket_index, "own_world": dist.get_world_size()}
    return {"equal": all(torch.equal(got[n], src[n]) for n in src), "own_world": dist.get_world_size(),
            "buckets": stats.buckets}
