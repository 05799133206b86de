"""Rank bodies for the broadcast-transport tests (no Megatron, no engine)."""

from __future__ import annotations

import torch


def _tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shapes = {"a": (64, 33), "b": (7,), "c": (128, 64), "d": (3, 5, 2), "e": (200, 100)}
    out = {n: torch.randn(s, generator=gen) for n, s in shapes.items()}
    out["f16"] = torch.randn(9, 3, generator=gen).to(torch.bfloat16)
    return out


def broadcast_stream(corrupt_receiver: bool, integrity_check: bool) -> dict:
    """Global rank 0 broadcasts ``_tensors()`` in 30 KB buckets; every rank returns what
    it received (rank 1 optionally flips one byte of the 2nd bucket on arrival)."""
    import torch.distributed as dist

    from megarl.weight_sync import SyncStats, WeightSyncIntegrityError, build_plan, stream_broadcast

    dist.init_process_group("gloo")
    src = _tensors()
    plan = build_plan([(n, t.shape, t.dtype) for n, t in src.items()], bucket_size_bytes=30_000)
    if corrupt_receiver and dist.get_rank() == 1:
        real_broadcast = dist.broadcast
        calls = {"n": 0}

        def flaky(tensor, src, group=None):
            work = real_broadcast(tensor, src, group=group)
            calls["n"] += 1
            if calls["n"] == 4:  # header, bucket 0, header, bucket 1 <- corrupt
                tensor[100] ^= 1
            return work

        dist.broadcast = flaky
    stats = SyncStats()
    try:
        got = {n: t.clone() for n, t in stream_broadcast(
            src.items() if dist.get_rank() == 0 else None, plan, src=0,
            integrity_check=integrity_check, stats=stats)}
    except WeightSyncIntegrityError as err:
        return {"error": str(err), "bucket": err.bucket_index, "names": err.names}
    equal = {n: torch.equal(got[n], src[n]) for n in src}
    return {"equal": equal, "dtypes": {n: got[n].dtype for n in got}, "metrics": stats.as_metrics(),
            "buckets": len(plan.buckets)}
