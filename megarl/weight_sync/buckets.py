"""Packing exported HF tensors into the plan's buckets, and unpacking them.

A bucket is one flat ``uint8`` buffer of ``BucketPlan.nbytes``; each tensor sits at
its slot's byte offset (zero padding between), so a bucket moves in one collective
and unpacks into zero-copy views. :class:`LiveBytes` counts the bytes of bucket
buffers still referenced (by views handed to the engine too), which is the extra
memory weight sync costs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from megarl.weight_sync.integrity import words_checksum
from megarl.weight_sync.plan import BucketPlan, ReshardPlan


class LiveBytes:
    """Bytes of transport buffers alive now and at the peak.

    Tracks storages, not tensor objects: a bucket buffer lives on while any view of
    it (e.g. held by vLLM until a layer is complete) is alive. Polled whenever a
    buffer is allocated, which is when the peak can grow.
    """

    def __init__(self) -> None:
        self._refs: list[tuple[StorageWeakRef, int]] = []
        self.peak = 0

    @property
    def now(self) -> int:
        self._refs = [(ref, n) for ref, n in self._refs if not ref.expired()]
        return sum(n for _, n in self._refs)

    def track(self, buffer: torch.Tensor) -> torch.Tensor:
        self._refs.append((StorageWeakRef(buffer.untyped_storage()), buffer.numel() * buffer.element_size()))
        self.peak = max(self.peak, self.now)
        return buffer


@dataclass
class PackedBucket:
    plan: BucketPlan
    buffer: torch.Tensor  # uint8 [plan.nbytes]
    sender_checksum: torch.Tensor | None  # int64 [2], None when integrity checks are off


def _slot_view(buffer: torch.Tensor, slot) -> torch.Tensor:
    """The slot's bytes of a bucket buffer as a tensor of the slot's dtype and shape."""
    return buffer[slot.offset : slot.offset + slot.nbytes].view(slot.dtype).view(slot.shape)


def pack_stream(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    plan: ReshardPlan,
    *,
    with_checksum: bool,
    live: LiveBytes,
) -> Iterator[PackedBucket]:
    """Copy ``(hf_name, full_tensor)`` pairs into bucket buffers; yield each bucket as
    soon as all its tensors arrived (one bucket open at a time when the stream follows
    the plan's order). Tensors are cast to the plan's dtype (the rollout dtype).

    Each tensor is copied once, straight into its slot (strided sources and the dtype
    cast included). The sender checksum is taken once per bucket, over the packed
    buffer (zero padding adds nothing; the same value as summing tensor by tensor at
    the slots' offsets), on the bucket's device with no host sync.

    Raises:
        KeyError: a tensor not in the plan.
        ValueError: a shape mismatch, a duplicate, or tensors missing at the end.
    """
    open_buffers: dict[int, tuple[torch.Tensor, set[str]]] = {}
    done: set[int] = set()
    for name, tensor in named_tensors:
        bucket, slot = plan.slot(name)
        if tuple(tensor.shape) != slot.shape:
            raise ValueError(
                f"weight sync: tensor {name!r} has shape {tuple(tensor.shape)}, the plan "
                f"expects {slot.shape}"
            )
        if bucket.index in done:
            raise ValueError(f"weight sync: tensor {name!r} was exported twice")
        if bucket.index not in open_buffers:
            buffer = live.track(torch.zeros(bucket.nbytes, dtype=torch.uint8, device=tensor.device))
            open_buffers[bucket.index] = (buffer, set())
        buffer, filled = open_buffers[bucket.index]
        if name in filled:
            raise ValueError(f"weight sync: tensor {name!r} was exported twice")
        _slot_view(buffer, slot).copy_(tensor.detach())
        del tensor
        filled.add(name)
        if len(filled) == len(bucket.slots):
            del open_buffers[bucket.index]
            done.add(bucket.index)
            checksum = words_checksum(buffer) if with_checksum else None
            yield PackedBucket(bucket, buffer, checksum)
            del buffer
    missing = [slot.name for b in plan.buckets if b.index not in done for slot in b.slots]
    missing = [n for n in missing if n not in open_buffers.get(plan.slot_index[n][0], (None, set()))[1]]
    if missing:
        raise ValueError(
            f"weight sync: the export ended without {len(missing)} planned tensors: "
            f"{missing[:8]}{' ...' if len(missing) > 8 else ''}"
        )


def unpack(bucket: BucketPlan, buffer: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """Zero-copy views ``(hf_name, tensor)`` into a bucket buffer."""
    return [
        (slot.name, buffer[slot.offset : slot.offset + slot.nbytes].view(slot.dtype).view(slot.shape))
        for slot in bucket.slots
    ]
