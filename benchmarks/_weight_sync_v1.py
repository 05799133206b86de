"""The bucketed TP export as of 2026-11-22 (commit 6e6fd1c), kept only so that
bench_weight_sync_gpu.py can time the previous version next to the current one in the
same run. Not used by megarl.

Bucketed tensor-parallel export: one all_gather per bucket instead of one per tensor.

Same output as :func:`megarl.models.export_hf_weights` (names, order, values, dtype;
checked bitwise by ``benchmarks/bench_weight_sync_gpu.py`` and the GPU tests), built
for speed on GPUs:

* the local TP shards of many parameters are packed with one ``torch.cat`` and
  gathered with one ``all_gather_into_tensor`` into ``[tp, bucket]``;
* each full HF tensor is then one strided view of that buffer plus at most one copy
  (per layout kind: ``split0``/``vocab`` rank-major rows, ``split1`` columns,
  ``gate_up`` halves, ``qkv`` query groups), i.e. 2-3 host ops per tensor instead of
  ~10: on 2 x H200 the per-tensor export was host-bound (~100 us per tensor);
* the next bucket's gather is launched before this bucket's tensors are handed out,
  so it runs on NCCL's stream while the consumer copies them.

Extra device memory: two buckets in flight, each ``bucket_size_bytes`` gathered plus
``bucket_size_bytes / tp`` packed. Yielded tensors may be views of the gathered buffer
(an embedding alone in its bucket): consume (copy) them before the next ``next()``.

Scope: pipeline and expert parallel size 1 with one chunk (the colocated TP layouts);
anything else falls back to the per-tensor export.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist
from megatron.core import parallel_state

__all__ = ["export_hf_weights_bucketed_v1"]


def _full_from_gathered(kind: str, gathered: torch.Tensor, shard_shape: torch.Size, dims) -> list[torch.Tensor]:
    """Full HF tensor(s) from every TP rank's shard of one parameter.

    Args:
        kind: layout kind (``megarl.models.converters.transforms``).
        gathered: ``[tp, shard.numel()]`` (any row stride), row r = rank r's shard.
        shard_shape: the local shard's shape.
        dims: ``megarl.models.converters.Dims``.

    Equals ``from_shards(kind, [rank shards], dims)``.
    """
    tp = gathered.shape[0]
    rows, rest = shard_shape[0], tuple(shard_shape[1:])
    if kind == "replicated":
        return [gathered[0].view(shard_shape)]
    if kind in ("split0", "vocab"):
        full = gathered.view(tp, *shard_shape).reshape(tp * rows, *rest)
        return [full[: dims.vocab_size] if kind == "vocab" else full]
    if kind == "split1":
        cols = rest[0]
        return [gathered.view(tp, rows, cols).transpose(0, 1).reshape(rows, tp * cols)]
    if kind == "gate_up":
        halves = gathered.view(tp, 2, rows // 2, *rest)
        return [halves[:, 0].reshape(tp * rows // 2, *rest), halves[:, 1].reshape(tp * rows // 2, *rest)]
    if kind == "qkv":
        hd, per_group = dims.head_dim, dims.num_heads // dims.num_query_groups
        grouped = gathered.view(tp, rows // ((per_group + 2) * hd), (per_group + 2) * hd, *rest)
        q, k, v = torch.split(grouped, [per_group * hd, hd, hd], dim=2)
        return [q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)]
    raise ValueError(f"unknown layout kind {kind!r}")


@torch.no_grad()
def export_hf_weights_bucketed_v1(
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
    from megarl.models.converters import build_plan, dims_of, is_split
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

    # Buckets: lists of (entry, shard, element offset); offset None = yielded as is.
    buckets: list[list[tuple]] = []
    current: list[tuple] = []
    used = 0
    for entry in plan:
        param = _find_param(params, entry.mcore_name)
        if param is None:
            raise ValueError(f"megatron parameter {entry.mcore_name!r} not found")
        shard = param.detach()
        if tp == 1 or not is_split(entry.kind):
            buckets.append([(entry, shard, None)])
            continue
        nbytes = tp * shard.numel() * shard.element_size()
        if current and (used + nbytes > bucket_size_bytes or shard.dtype != current[0][1].dtype):
            buckets.append(current)
            current, used = [], 0
        offset = sum(s.numel() for _, s, _ in current)
        current.append((entry, shard, offset))
        used += nbytes
    if current:
        buckets.append(current)

    def launch(bucket):
        """Pack and start the gather of `bucket`: (bucket, gathered [tp, n] or None, work)."""
        if bucket[0][2] is None:
            return bucket, None, None
        shards = [shard.reshape(-1) for _, shard, _ in bucket]
        numel = sum(s.numel() for s in shards)
        packed = torch.cat(shards) if len(shards) > 1 else shards[0].contiguous()
        gathered = torch.empty(tp * numel, dtype=packed.dtype, device=packed.device)
        work = dist.all_gather_into_tensor(gathered, packed, group=group, async_op=True)
        return bucket, gathered.view(tp, numel), work

    pending = launch(buckets[0]) if buckets else None
    for index in range(len(buckets)):
        bucket, gathered, work = pending
        pending = launch(buckets[index + 1]) if index + 1 < len(buckets) else None
        if work is not None:
            work.wait()
        for entry, shard, offset in bucket:
            if offset is None:
                from megarl.models.converters import from_shards

                full = from_shards(entry.kind, [shard], dims) if tp == 1 else [shard]
            else:
                view = gathered[:, offset : offset + shard.numel()]
                full = _full_from_gathered(entry.kind, view, shard.shape, dims)
            yield from zip(entry.hf_names, full)
        del gathered, bucket
