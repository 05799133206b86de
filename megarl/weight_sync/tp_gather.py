"""Bucketed tensor-parallel export: one all_gather per bucket instead of one per tensor.

Same output as :func:`megarl.models.export_hf_weights` (same names, order, values and
dtype: each full tensor is built by the same ``from_shards`` of megarl.models), but the
local TP shards of many parameters are packed into one flat buffer and gathered with a
single ``all_gather_into_tensor``; the next bucket's gather runs on NCCL's stream while
this bucket's tensors are rebuilt and consumed.

Why: per-tensor ``all_gather`` of a 1.5B model in bf16 reached 39 % of the raw gather
bandwidth on 2 x H200 (hundreds of small collectives plus a cat per tensor); one gather
per 256 MiB reaches the raw rate.

Extra device memory: two buckets in flight, each ``bucket_size_bytes`` gathered plus
``bucket_size_bytes / tp`` packed, i.e. about ``2 * (1 + 1/tp) * bucket_size_bytes``
before the consumer's copies (pass half the byte budget to stay within one).

Scope: pipeline and expert parallel size 1 (the colocated TP layouts); anything else
falls back to the per-tensor export.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist
from megatron.core import parallel_state

__all__ = ["export_hf_weights_bucketed"]

_ALIGN = 16


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _bytes_of(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@torch.no_grad()
def export_hf_weights_bucketed(
    chunks: Sequence[torch.nn.Module], hf_config, *, bucket_size_bytes: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, full_tensor)`` like ``megarl.models.export_hf_weights``.

    Collective over the TP group: every TP rank must iterate to the end in lockstep.

    Args:
        chunks: this rank's model chunks (from ``megarl.models.build_model``, possibly
            DDP / Float16Module wrapped).
        hf_config: the HF config the chunks were built from.
        bucket_size_bytes: gathered (full) bytes per bucket; a larger parameter gets
            a bucket of its own.
    """
    from megarl.models import export_hf_weights, unwrap_chunk
    from megarl.models.converters import build_plan, dims_of, from_shards, is_split
    from megarl.models.weights import _find_param

    if bucket_size_bytes <= 0:
        raise ValueError(f"bucket_size_bytes must be > 0, got {bucket_size_bytes}")
    if (
        parallel_state.get_pipeline_model_parallel_world_size() > 1
        or parallel_state.get_expert_model_parallel_world_size() > 1
        or len(chunks) > 1
    ):
        yield from export_hf_weights(chunks, hf_config)
        return

    model = unwrap_chunk(chunks[0])
    meta = getattr(model, "megarl_meta", None)
    if meta is None:
        raise ValueError("chunks were not built by megarl.models.build_model (no megarl_meta)")
    plan = [e for e in build_plan(hf_config, model.config, value_head=meta["value_head"]) if e.export]
    dims = dims_of(hf_config)
    params = dict(model.named_parameters())
    group = parallel_state.get_tensor_model_parallel_group()
    tp = dist.get_world_size(group)
    local_budget = max(1, bucket_size_bytes // tp)

    # Buckets of (entry, local shard, byte offset); replicated params ride along unsplit.
    buckets: list[list[tuple]] = []
    current: list[tuple] = []
    used = 0
    for entry in plan:
        param = _find_param(params, entry.mcore_name)
        if param is None:
            raise ValueError(f"megatron parameter {entry.mcore_name!r} not found")
        shard = param.detach()
        if tp == 1 or not is_split(entry.kind):
            if current:
                buckets.append(current)
                current, used = [], 0
            buckets.append([(entry, shard, None)])
            continue
        offset = _align(used)
        if current and offset + _bytes_of(shard) > local_budget:
            buckets.append(current)
            current, used, offset = [], 0, 0
        current.append((entry, shard, offset))
        used = offset + _bytes_of(shard)
    if current:
        buckets.append(current)

    def launch(bucket):
        """Pack and start the gather of `bucket`; returns (bucket, gathered, local_bytes, work)."""
        if bucket[0][2] is None:  # unsplit parameter
            return bucket, None, 0, None
        entry, last, last_off = bucket[-1]
        local_bytes = _align(last_off + _bytes_of(last))
        device = last.device
        packed = torch.empty(local_bytes, dtype=torch.uint8, device=device)
        for _, shard, offset in bucket:
            packed[offset : offset + _bytes_of(shard)].copy_(shard.contiguous().reshape(-1).view(torch.uint8))
        gathered = torch.empty(tp * local_bytes, dtype=torch.uint8, device=device)
        work = dist.all_gather_into_tensor(gathered, packed, group=group, async_op=True)
        return bucket, gathered, local_bytes, work

    pending = launch(buckets[0]) if buckets else None
    for index in range(len(buckets)):
        bucket, gathered, local_bytes, work = pending
        pending = launch(buckets[index + 1]) if index + 1 < len(buckets) else None
        if work is not None:
            work.wait()
        for entry, shard, offset in bucket:
            if offset is None:
                full = from_shards(entry.kind, [shard], dims)
            else:
                n = _bytes_of(shard)
                shards = [
                    gathered[r * local_bytes + offset : r * local_bytes + offset + n]
                    .view(shard.dtype)
                    .view(shard.shape)
                    for r in range(tp)
                ]
                full = from_shards(entry.kind, shards, dims)
            yield from zip(entry.hf_names, full)
        del gathered, bucket
