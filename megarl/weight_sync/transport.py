"""Transports: move the export into rollout engines bucket by bucket.

Both return a lazy ``Iterator[(hf_name, tensor)]`` that a rollout engine's
``reload_weights`` consumes; the buckets are packed, moved, checked and unpacked as
the engine pulls, so about one bucket (plus the layer vLLM is assembling) is alive.

* :func:`stream_in_process` -- colocated replicas: this rank already holds the full
  tensors (the collective export gathered them over TP/PP/EP), the engine lives in
  this process; buckets go straight to it (no copy across processes; on GPU the
  buffers stay on the device).
* :func:`stream_broadcast` -- replicas in other processes: the source rank packs and
  broadcasts each bucket (gloo on CPU, NCCL on GPU) to a group of receivers who know the
  layout from the same plan: a group of this process's world (:class:`WorldGroup`) or the
  weight-push group to the standalone engines (:class:`megarl.weight_sync.sync_group.SyncGroup`).

Integrity (``weight_sync.integrity_check``): the sender's checksum travels with the
bucket, the receiver recomputes it on what it got and raises
:class:`WeightSyncIntegrityError` naming the bucket and its tensors on mismatch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Protocol

import torch
import torch.distributed as dist

from megarl.weight_sync.buckets import LiveBytes, PackedBucket, pack_stream, unpack
from megarl.weight_sync.integrity import WeightSyncIntegrityError, checksum_pair, words_checksum
from megarl.weight_sync.plan import ReshardPlan

_END = -1


class Broadcaster(Protocol):
    """The group a stream is broadcast over: this process's ``rank`` in it and its broadcast."""

    rank: int

    def broadcast(self, tensor: torch.Tensor, src: int) -> None: ...


class WorldGroup:
    """A group of this process's torch.distributed world (None: the whole world); global ranks."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self.rank = dist.get_rank()

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        dist.broadcast(tensor, src, group=self.group)


@dataclass
class SyncStats:
    """What one sync moved. ``bytes`` = payload bytes of the tensors (no padding)."""

    bytes: int = 0
    tensors: int = 0
    buckets: int = 0
    seconds: float = 0.0
    live: LiveBytes = field(default_factory=LiveBytes)

    @property
    def peak_extra_bytes(self) -> int:
        return self.live.peak

    def as_metrics(self, prefix: str = "weight_sync/") -> dict[str, float]:
        gbps = self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0
        return {
            f"{prefix}seconds": self.seconds,
            f"{prefix}bytes": float(self.bytes),
            f"{prefix}gb_per_s": gbps,
            f"{prefix}buckets": float(self.buckets),
            f"{prefix}tensors": float(self.tensors),
            f"{prefix}peak_extra_bytes": float(self.live.peak),
        }


def _verify(packed: PackedBucket) -> None:
    got = words_checksum(packed.buffer)
    if not torch.equal(got, packed.sender_checksum):
        raise WeightSyncIntegrityError(
            packed.plan.index, packed.plan.names, checksum_pair(packed.sender_checksum), checksum_pair(got)
        )


def _deliver(packed: PackedBucket, stats: SyncStats, integrity_check: bool) -> list[tuple[str, torch.Tensor]]:
    if integrity_check:
        _verify(packed)
    stats.buckets += 1
    stats.tensors += len(packed.plan.slots)
    stats.bytes += sum(slot.nbytes for slot in packed.plan.slots)
    return unpack(packed.plan, packed.buffer)


def stream_in_process(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    plan: ReshardPlan,
    *,
    integrity_check: bool = True,
    stats: SyncStats | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Bucketed, checked stream of the local export for an engine in this process."""
    stats = stats if stats is not None else SyncStats()
    start = time.perf_counter()
    for packed in pack_stream(named_tensors, plan, with_checksum=integrity_check, live=stats.live):
        views = _deliver(packed, stats, integrity_check)
        del packed
        yield from views
        del views
    stats.seconds += time.perf_counter() - start


def stream_broadcast(
    named_tensors: Iterable[tuple[str, torch.Tensor]] | None,
    plan: ReshardPlan,
    *,
    src: int,
    group: Broadcaster | None = None,
    device: torch.device | str = "cpu",
    integrity_check: bool = True,
    stats: SyncStats | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Broadcast the source rank's export, bucket by bucket, to every rank of ``group``
    (None: this process's whole world).

    Every rank of ``group`` must consume its iterator to the end (the collectives run
    as it is pulled). A receiver whose bucket fails the integrity check stops
    delivering, keeps receiving to the end (so the source does not hang) and then
    raises :class:`WeightSyncIntegrityError`. The source's iterator is pulled between
    the broadcasts, so it must not run collectives the receivers take part in (a
    collective export must finish first when receivers are in the exporter's groups). ``src`` is
    the source's rank in ``group``; it passes ``named_tensors``, the others pass ``None``. Each
    rank, the source included, gets the full stream.
    """
    stats = stats if stats is not None else SyncStats()
    start = time.perf_counter()
    device = torch.device(device)
    header = torch.zeros(3, dtype=torch.int64, device=device)  # bucket index, checksum[2]
    group = group if group is not None else WorldGroup()
    if group.rank == src:
        if named_tensors is None:
            raise ValueError("stream_broadcast: the source rank must pass the export")
        packs = pack_stream(named_tensors, plan, with_checksum=integrity_check, live=stats.live)
        for packed in packs:
            header[0] = packed.plan.index
            header[1:] = packed.sender_checksum if integrity_check else 0
            group.broadcast(header, src)
            group.broadcast(packed.buffer, src)
            # The source's own engine gets the packed buffer; only receivers verify.
            packed.sender_checksum = None
            views = _deliver(packed, stats, integrity_check=False)
            del packed
            yield from views
            del views
        header[0] = _END
        group.broadcast(header, src)
    else:
        error: WeightSyncIntegrityError | None = None
        while True:
            group.broadcast(header, src)
            index = int(header[0])
            if index == _END:
                break
            bucket = plan.buckets[index]
            buffer = stats.live.track(torch.empty(bucket.nbytes, dtype=torch.uint8, device=device))
            group.broadcast(buffer, src)
            if error is not None:
                continue  # keep the collectives in step with the source, deliver nothing
            packed = PackedBucket(bucket, buffer, header[1:].clone() if integrity_check else None)
            del buffer
            try:
                views = _deliver(packed, stats, integrity_check)
            except WeightSyncIntegrityError as exc:
                error = exc
                continue
            del packed
            yield from views
            del views
        if error is not None:
            raise error
    stats.seconds += time.perf_counter() - start
