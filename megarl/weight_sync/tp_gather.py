"""Bucketed tensor-parallel export: full HF tensors straight out of grouped all_gathers.

Same output as :func:`megarl.models.export_hf_weights` (names, order, values, dtype;
checked bitwise by the CPU tests in ``tests/weight_sync``, the GPU tests and
``benchmarks/bench_weight_sync_gpu.py``), built for speed and bounded memory on GPUs:

* **One reused buffer.** All gathers land in one ``bucket_size_bytes`` ring buffer,
  allocated once per export: buckets of about half of it alternate, so bucket k + 1
  is gathered (on NCCL's stream) while the consumer copies bucket k out. Peak extra
  device memory is the ring: one bucket (tensors larger than that: see below).
* **Gathered in HF layout.** Each HF tensor gets its own region of the bucket and its
  own ``all_gather_into_tensor`` (NCCL runs a bucket's gathers as one grouped launch).
  all_gather writes rank blocks one after the other, which already *is* the HF layout
  of every row-split tensor once each rank sends the right rows: ``split0`` / ``vocab``
  (the shard), ``gate_up`` (the gate rows, then the up rows), ``qkv`` (q, k and v rows of
  the rank's query groups; with one group per rank these are row slices, with several
  they are packed first). Row-parallel ``split1`` shards are sent transposed (one local
  copy of the shard), so the gathered region is the full tensor's transpose: the
  yielded tensor is its ``.t()`` view, which the consumer's copy turns back. No
  per-tensor ``cat``, no full intermediate copy: each yielded tensor is a view.
* **Tensors larger than the ring** (an untied 7B LM head: 1.09 GB) are gathered in
  row chunks through the ring straight into a destination the consumer lends
  (``destinations[name]``, e.g. the rollout engine's own parameter of the HF shape),
  and that destination is yielded (the consumer's ``copy_`` onto itself is a no-op).
  Without a destination such a tensor gets a buffer of its own for its gather
  (extra memory: that tensor).
* ``replicated`` parameters need no gather: the parameter itself is yielded.

Yielded tensors are views of the ring buffer: consume (copy) them before the next
``next()``. Collective over the TP group: every TP rank iterates to the end in lockstep.

Scope: pipeline and expert parallel size 1 with one chunk (the colocated TP layouts);
anything else falls back to the per-tensor export.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from megatron.core import parallel_state

__all__ = ["export_hf_weights_bucketed", "full_from_gathered", "release_export_buffers"]

_ALIGN = 16  # byte alignment of regions in the ring buffer


def full_from_gathered(kind: str, gathered: torch.Tensor, shard_shape: torch.Size, dims) -> list[torch.Tensor]:
    """Full HF tensor(s) from every TP rank's raw shard of one parameter.

    Args:
        kind: layout kind (``megarl.models.converters.transforms``).
        gathered: ``[tp, shard.numel()]`` (any row stride), row r = rank r's shard.
        shard_shape: the local shard's shape.
        dims: ``megarl.models.converters.Dims``.

    Equals ``from_shards(kind, [rank shards], dims)`` (views where the layout allows).
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


# ----------------------------------------------------------------------------- schedule
@dataclass
class _Part:
    """One HF tensor of one megatron parameter, as this rank contributes it.

    The rank sends either rows ``[r0, r1)`` of its shard (contiguous, no copy) or
    ``pack(shard)`` (a strided piece, copied into the bucket's staging area first).
    ``full(region)`` turns the gathered region (``tp * numel`` elements, rank-major)
    into the HF tensor (a view). ``hf_rows``: rows of the HF tensor (vocab: unpadded).
    """

    hf_name: str
    param: torch.nn.Parameter
    local_shape: tuple[int, ...]
    rows: tuple[int, int] | None
    pack: Callable[[torch.Tensor], torch.Tensor] | None
    full: Callable[[torch.Tensor], torch.Tensor]
    hf_rows: int

    @property
    def numel(self) -> int:
        return torch.Size(self.local_shape).numel()

    @property
    def dtype(self) -> torch.dtype:
        return self.param.dtype

    def local_input(self, shard: torch.Tensor, staging: torch.Tensor | None) -> torch.Tensor:
        """This rank's contiguous send buffer for the part (flat)."""
        if self.pack is None:
            return shard[self.rows[0] : self.rows[1]].reshape(-1)
        staging = staging.view(self.local_shape)
        staging.copy_(self.pack(shard))
        return staging.view(-1)


@dataclass
class _Bucket:
    """Parts gathered together: ``(part, out offset, staging offset or -1)`` in bytes
    from the bucket's start; ``local``: (name, parameter) pairs yielded as they are,
    in their export position (``index`` = the position among ``items``)."""

    items: list = field(default_factory=list)
    # ("gather", part, out_off, stg_off) | ("local", name, param) | ("direct", part, dest)
    nbytes: int = 0  # ring bytes
    volume: int = 0  # gathered bytes (ring and direct)
    dtype: torch.dtype | None = None
    chunk: tuple[int, int] | None = None  # row chunk [a, b) of a part larger than the ring
    dedicated: bool = False  # larger than the ring and no destination: own buffer


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _parts_of(entry, param: torch.nn.Parameter, tp: int, dims) -> list[_Part]:
    """The HF tensors of one split megatron parameter as gather parts."""
    shape = tuple(param.shape)
    rows, rest = shape[0], shape[1:]
    names = entry.hf_names
    kind = entry.kind

    def rowwise(name: str, r0: int, r1: int, hf_rows: int) -> _Part:
        n = r1 - r0
        return _Part(
            name, param, (n, *rest), (r0, r1), None,
            lambda region, n=n, hf_rows=hf_rows: region.view(tp * n, *rest)[:hf_rows], hf_rows,
        )

    if kind == "split0":
        return [rowwise(names[0], 0, rows, tp * rows)]
    if kind == "vocab":
        return [rowwise(names[0], 0, rows, dims.vocab_size)]
    if kind == "gate_up":
        half = rows // 2
        return [rowwise(names[0], 0, half, tp * half), rowwise(names[1], half, rows, tp * half)]
    if kind == "qkv":
        hd, per_group = dims.head_dim, dims.num_heads // dims.num_query_groups
        width = (per_group + 2) * hd
        groups = rows // width
        bounds = [(0, per_group * hd), (per_group * hd, (per_group + 1) * hd), ((per_group + 1) * hd, width)]
        if groups == 1:
            return [rowwise(name, a, b, tp * (b - a)) for name, (a, b) in zip(names, bounds)]
        parts = []
        for name, (a, b) in zip(names, bounds):
            n = groups * (b - a)
            parts.append(_Part(
                name, param, (groups, b - a, *rest), None,
                lambda shard, a=a, b=b: shard.view(groups, width, *rest)[:, a:b],
                lambda region, n=n: region.view(tp * n, *rest), tp * n,
            ))
        return parts
    if kind == "split1":
        cols = rest[0]
        return [_Part(
            names[0], param, (cols, rows), None, lambda shard: shard.t(),
            lambda region: region.view(tp * cols, rows).t(), rows,
        )]
    raise ValueError(f"unknown layout kind {kind!r}")


def _check_destination(part: _Part, dest: torch.Tensor) -> None:
    want = (part.hf_rows, *part.local_shape[1:])
    if tuple(dest.shape) != want or dest.dtype != part.dtype or not dest.is_contiguous():
        raise ValueError(
            f"weight sync destination for {part.hf_name!r} must be a contiguous {part.dtype} tensor "
            f"of shape {want}, got {tuple(dest.shape)} {dest.dtype}"
        )


def _part_bytes(part: _Part, tp: int) -> tuple[int, int]:
    """(gathered bytes, staging bytes), aligned."""
    es = part.param.element_size()
    return _align(tp * part.numel * es), (_align(part.numel * es) if part.pack is not None else 0)


def _schedule(plan, params, tp: int, dims, ring_bytes: int, destinations: Mapping[str, torch.Tensor]) -> list[_Bucket]:
    """Buckets in export order: parts packed up to half the ring (so two alternate),
    a part up to the whole ring alone, larger row-sliceable parts with a destination
    in row chunks of at most half the ring, anything else larger on its own buffer."""
    from megarl.models.converters import is_split
    from megarl.models.weights import _find_param

    target = max(_ALIGN, ring_bytes // 2)
    volume_cap = 2 * ring_bytes  # direct gathers need no ring: larger groups, fewer launches
    buckets: list[_Bucket] = []
    current = _Bucket()

    def close() -> None:
        nonlocal current
        if current.items:
            buckets.append(current)
        current = _Bucket()

    for entry in plan:
        param = _find_param(params, entry.mcore_name)
        if param is None:
            raise ValueError(f"megatron parameter {entry.mcore_name!r} not found")
        if not is_split(entry.kind):
            current.items.append(("local", entry.hf_names[0], param))
            continue
        for part in _parts_of(entry, param, tp, dims):
            out_b, stg_b = _part_bytes(part, tp)
            size = out_b + stg_b
            dest = destinations.get(part.hf_name)
            if dest is not None and part.rows is not None and part.hf_rows == tp * part.local_shape[0]:
                # rank blocks of rows = the HF layout: gather straight into the destination
                _check_destination(part, dest)
                if current.items and (current.volume + out_b > volume_cap or current.dtype not in (None, part.dtype)):
                    close()
                current.items.append(("direct", part, dest))
                current.volume += out_b
                current.dtype = part.dtype
                continue
            if size > ring_bytes:
                close()
                dest = destinations.get(part.hf_name)
                row_bytes = tp * part.numel * part.param.element_size() // part.local_shape[0]
                if dest is not None and part.rows is not None and _align(row_bytes) <= target:
                    step = target // _align(row_bytes)
                    for a in range(0, part.local_shape[0], step):
                        b = min(part.local_shape[0], a + step)
                        buckets.append(_Bucket([("gather", part, 0, -1)], _align(row_bytes * (b - a)), part.dtype, (a, b)))
                else:
                    buckets.append(_Bucket([("gather", part, 0, out_b if stg_b else -1)], size, part.dtype, dedicated=True))
                continue
            if current.items and (
                current.nbytes + size > target
                or current.volume + size > volume_cap
                or current.dtype not in (None, part.dtype)
            ):
                close()
            # staging after the output region of this part: offsets are per part
            current.items.append(("gather", part, current.nbytes, current.nbytes + out_b if stg_b else -1))
            current.nbytes += size
            current.volume += size
            current.dtype = part.dtype
    close()
    return buckets


# ----------------------------------------------------------------------------- running
def _coalesced_all_gather(group, outputs: list[torch.Tensor], inputs: list[torch.Tensor]):
    """Start ``all_gather_into_tensor(outputs[i], inputs[i])`` for every i; with NCCL one
    C++ call (one grouped launch), else one async call each. Returns a waitable or None."""
    if not outputs:
        return None
    if len(outputs) > 1 and dist.get_backend(group) == "nccl":
        fn = getattr(group, "allgather_into_tensor_coalesced", None) or getattr(group, "all_gather_single_coalesced", None)
        if fn is not None:
            opts = dist.AllgatherOptions()
            if hasattr(opts, "asyncOp"):
                opts.asyncOp = True
            return fn(outputs, inputs, opts)
    return _Works([dist.all_gather_into_tensor(o, i, group=group, async_op=True) for o, i in zip(outputs, inputs)])


class _Works:
    def __init__(self, works) -> None:
        self.works = works

    def wait(self) -> None:
        for work in self.works:
            work.wait()


@dataclass
class _Ready:
    """One bucket with every tensor view built: what a sync does is copies, one grouped
    gather, and yielding these views."""

    packs: list  # (staging view, strided source view): copied before the gather
    outputs: list
    inputs: list
    yields: list  # (hf_name, tensor) in export order; None entries for chunk copies
    copies: list  # chunk buckets: (dest rows view, ring rows view)
    final: tuple | None  # chunk buckets: (hf_name, dest) after the last chunk


class _Exporter:
    """The schedule and ring buffer of one model, with all views prebuilt.

    Rebuilt when a parameter's storage moved (offload/onload) or the destinations
    changed; otherwise an export only launches gathers and yields cached views.
    """

    def __init__(self, buckets: list[_Bucket], tp: int, ring_bytes: int, device, group) -> None:
        self.buckets, self.tp, self.ring_bytes, self.group = buckets, tp, ring_bytes, group
        self.device = device
        self.ring: torch.Tensor | None = None
        self.key = None
        self.ready: list[_Ready] = []
        self.bases: list[int] = []

    @staticmethod
    def _key(buckets: list[_Bucket], destinations: Mapping[str, torch.Tensor]) -> tuple:
        params = {id(i[2] if i[0] == "local" else i[1].param): (i[2] if i[0] == "local" else i[1].param)
                  for b in buckets for i in b.items}
        dests = tuple(sorted((n, t.data_ptr()) for n, t in destinations.items()))
        return tuple(p.data_ptr() for p in params.values()), dests

    def prepare(self, destinations: Mapping[str, torch.Tensor]) -> None:
        key = self._key(self.buckets, destinations)
        if key == self.key and self.ring is not None:
            return
        self.release()
        self.ring = torch.empty(self.ring_bytes, dtype=torch.uint8, device=self.device)
        self.bases = self._place()
        self.ready = [self._build(b, base, destinations) for b, base in zip(self.buckets, self.bases)]
        self.key = key

    def release(self) -> None:
        """Drop the ring buffer and the views (the memory comes back)."""
        self.ring, self.ready, self.key = None, [], None

    def _place(self) -> list[int | None]:
        """Ring offset of each bucket: right after the previous one, or at the start if
        it fits before it; None = launched only after the previous one was consumed (at
        offset 0); dedicated buckets have their own buffer (-1)."""
        bases: list[int | None] = []
        prev_base, prev_size = 0, 0
        for b in self.buckets:
            if b.dedicated or not b.nbytes:
                bases.append(-1)
                prev_base, prev_size = 0, 0
                continue
            if prev_base + prev_size + b.nbytes <= self.ring_bytes:
                base = prev_base + prev_size
            elif b.nbytes <= prev_base:
                base = 0
            else:
                base = None
            bases.append(base)
            prev_base, prev_size = (0 if base is None else base), b.nbytes
        return bases

    def _build(self, bucket: _Bucket, base: int | None, destinations) -> _Ready:
        tp = self.tp
        if bucket.dedicated:
            buffer = torch.empty(bucket.nbytes, dtype=torch.uint8, device=self.device)
        elif bucket.nbytes:
            start = base or 0
            buffer = self.ring[start : start + bucket.nbytes]
        else:
            buffer = None
        ready = _Ready([], [], [], [], [], None)
        for item in bucket.items:
            if item[0] == "local":
                ready.yields.append((item[1], item[2].detach()))
                continue
            if item[0] == "direct":
                _, part, dest = item
                ready.outputs.append(dest.view(-1))
                ready.inputs.append(part.param.detach()[part.rows[0] : part.rows[1]].reshape(-1))
                ready.yields.append((part.hf_name, dest))
                continue
            _, part, out_off, stg_off = item
            shard = part.param.detach()
            es = part.param.element_size()
            if bucket.chunk is not None:
                a, b = bucket.chunk
                r0 = part.rows[0]
                local = shard[r0 + a : r0 + b].reshape(-1)
                region = buffer[: tp * local.numel() * es].view(part.dtype)
                ready.outputs.append(region)
                ready.inputs.append(local)
                dest = destinations[part.hf_name]
                per_rank = part.local_shape[0]
                rows = region.view(tp, b - a, *part.local_shape[1:])
                for r in range(tp):
                    lo, hi = r * per_rank + a, min(r * per_rank + b, part.hf_rows)
                    if hi > lo:
                        ready.copies.append((dest[lo:hi], rows[r, : hi - lo]))
                if b == per_rank:
                    ready.final = (part.hf_name, dest)
                continue
            if part.pack is None:
                local = shard[part.rows[0] : part.rows[1]].reshape(-1)
            else:
                staging = buffer[stg_off : stg_off + part.numel * es].view(part.dtype)
                ready.packs.append((staging.view(part.local_shape), part.pack(shard)))
                local = staging
            region = buffer[out_off : out_off + tp * part.numel * es].view(part.dtype)
            ready.outputs.append(region)
            ready.inputs.append(local)
            ready.yields.append((part.hf_name, part.full(region)))
        return ready

    def launch(self, k: int):
        ready = self.ready[k]
        for staging, source in ready.packs:
            staging.copy_(source)
        return _coalesced_all_gather(self.group, ready.outputs, ready.inputs)

    def run(self) -> Iterator[tuple[str, torch.Tensor]]:
        n = len(self.buckets)
        work = self.launch(0) if n else None
        for k in range(n):
            current, work = work, None
            nxt_launched = False
            if k + 1 < n and self.bases[k + 1] is not None:
                work = self.launch(k + 1)
                nxt_launched = True
            if current is not None:
                current.wait()
            ready = self.ready[k]
            yield from ready.yields
            for dest, rows in ready.copies:
                dest.copy_(rows)
            if ready.final is not None:
                yield ready.final
            if k + 1 < n and not nxt_launched:
                work = self.launch(k + 1)


_EXPORTERS: dict = {}  # (id(model), ring bytes, destination names) -> (weakref(model), _Exporter)


def release_export_buffers() -> None:
    """Free the ring buffers that :func:`export_hf_weights_bucketed` keeps between syncs."""
    for _, exporter in _EXPORTERS.values():
        exporter.release()
    _EXPORTERS.clear()


@torch.no_grad()
def export_hf_weights_bucketed(
    chunks: Sequence[torch.nn.Module],
    hf_config,
    *,
    bucket_size_bytes: int,
    destinations: Mapping[str, torch.Tensor] | None = None,
    keep_buffers: bool = True,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, full_tensor)`` like ``megarl.models.export_hf_weights``.

    Collective over the TP group: every TP rank must iterate to the end in lockstep.

    Args:
        chunks: this rank's model chunks (from ``megarl.models.build_model``, possibly
            DDP / Float16Module wrapped).
        hf_config: the HF config the chunks were built from.
        bucket_size_bytes: the ring buffer (the extra device memory) in bytes.
        destinations: optional ``hf_name -> tensor`` (contiguous, HF shape and dtype)
            for tensors larger than the ring: they are written there in row chunks and
            that tensor is yielded. Others are ignored. Every TP rank must pass the
            same names (the schedule, hence the collectives, depends on them).
        keep_buffers: keep the ring buffer and the prebuilt views for the next export
            of this model (host work per tensor drops to the consumer's copy; the
            ring's memory stays allocated until :func:`release_export_buffers`).
    """
    import weakref

    from megarl.models import export_hf_weights, unwrap_chunk
    from megarl.models.converters import build_plan, dims_of, from_shards

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
    group = parallel_state.get_tensor_model_parallel_group()
    tp = dist.get_world_size(group)
    destinations = dict(destinations or {})

    if tp == 1:
        from megarl.models.weights import _find_param

        params = dict(model.named_parameters())
        plan = [e for e in build_plan(hf_config, model.config, value_head=meta["value_head"]) if e.export]
        dims = dims_of(hf_config)
        for entry in plan:
            shard = _find_param(params, entry.mcore_name).detach()
            yield from zip(entry.hf_names, from_shards(entry.kind, [shard], dims))
        return

    ring_bytes = _align(int(bucket_size_bytes))
    cache_key = (id(model), ring_bytes, tuple(sorted(destinations)))
    cached = _EXPORTERS.get(cache_key)
    exporter = cached[1] if cached is not None and cached[0]() is model else None
    if exporter is None:
        plan = [e for e in build_plan(hf_config, model.config, value_head=meta["value_head"]) if e.export]
        params = dict(model.named_parameters())
        buckets = _schedule(plan, params, tp, dims_of(hf_config), ring_bytes, destinations)
        for bucket in buckets:
            if bucket.chunk is not None:
                _check_destination(bucket.items[0][1], destinations[bucket.items[0][1].hf_name])
        device = next(iter(params.values())).device
        exporter = _Exporter(buckets, tp, ring_bytes, device, group)
    exporter.prepare(destinations)
    try:
        yield from exporter.run()
    finally:
        if keep_buffers:
            _EXPORTERS[cache_key] = (weakref.ref(model), exporter)
        else:
            exporter.release()
            _EXPORTERS.pop(cache_key, None)
