"""Bucketed tensor-parallel export: full HF tensors straight out of grouped all_gathers.

Same output as :func:`megarl.models.export_hf_weights` (names, order, values, dtype;
checked bitwise by the CPU tests in ``tests/weight_sync``, the GPU tests and
``benchmarks/bench_weight_sync_gpu.py``), built for speed and bounded memory on GPUs:

* **One reused buffer.** Gathers land in one ``bucket_size_bytes`` ring buffer, kept
  between exports with every tensor view prebuilt (a sync is: grouped gathers, a few
  copies, yields). Buckets of about half the ring alternate, so bucket k + 1 is
  gathered (on NCCL's stream) while bucket k is copied out. Peak extra device
  memory: the ring, i.e. one bucket (see below for larger tensors).
* **Gathered in HF layout.** Each HF tensor gets its own ``all_gather_into_tensor``
  (one grouped NCCL launch per bucket, one C++ call). all_gather writes rank blocks
  one after the other, which already *is* the HF layout of every row-split tensor
  once each rank sends the right rows: ``split0`` / ``vocab`` (the shard), ``gate_up``
  (gate rows, then up rows), ``qkv`` (q, k, v rows of the rank's query groups: row
  slices with one group per rank, packed first with several). Those are yielded as
  views. Row-parallel ``split1`` shards gather to ``[tp, rows, cols]``; one copy with
  contiguous inner rows permutes that to ``[rows, tp * cols]``.
* **Destinations.** A consumer may lend ``destinations[name]`` (contiguous, HF shape
  and dtype; e.g. a row slice of vLLM's fused ``qkv_proj`` / ``gate_up_proj`` weight).
  Row-split tensors are then gathered straight into it (no ring, no copy), ``split1``
  tensors and padded vocab rows pass through the ring in row chunks of at most half
  of it, and the destination is yielded (a consumer's ``copy_`` onto itself is a no-op).
  So with destinations no tensor, however large, needs more than the ring. Without one,
  a tensor larger than the ring gets a buffer of its own (extra memory: that tensor).
* ``replicated`` parameters need no gather: the parameter itself is yielded.

Yielded tensors may be views of the ring buffer: consume (copy) them before the next
``next()``. Collective over the TP group: every TP rank iterates to the end in lockstep.

Scope: pipeline and expert parallel size 1 with one chunk (the colocated TP layouts), layout kinds of
:data:`BUCKETED_KINDS` (not GPT-OSS's stacked experts, Qwen3.5's gated attention and DeltaNet); anything else
falls back to the per-tensor export.
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

    ``layout``: ``rows`` = the rank sends rows ``[r0, r1)`` of its shard and the rank
    blocks are the HF tensor (``full(region)`` is a view; vocab: minus padded rows);
    ``packed`` = ``pack(shard)`` (strided) is copied to staging first, then as ``rows``;
    ``cols`` = the whole ``[rows, cols]`` shard, gathered ``[tp, rows, cols]``, HF
    tensor ``[rows, tp * cols]`` by a permuting copy.
    """

    hf_name: str
    param: torch.nn.Parameter
    layout: str
    local_shape: tuple[int, ...]
    hf_shape: tuple[int, ...]
    rows: tuple[int, int] | None = None
    pack: Callable[[torch.Tensor], torch.Tensor] | None = None

    @property
    def numel(self) -> int:
        return torch.Size(self.local_shape).numel()

    @property
    def dtype(self) -> torch.dtype:
        return self.param.dtype

    @property
    def row_numel(self) -> int:
        return self.numel // self.local_shape[0]


@dataclass
class _Bucket:
    """What one grouped gather launch carries. Items, in export order:
    ``("local", name, param)`` yielded as is; ``("direct", part, dest)`` gathered into
    ``dest``; ``("ring", part, out_off, extra_off, (a, b) or None, dest or None)``
    gathered at ``out_off`` of the bucket (rows ``a:b`` of the part's local rows),
    ``extra_off`` = staging (packed) or the permuted HF tensor (cols, no dest), -1 none.
    """

    items: list = field(default_factory=list)
    nbytes: int = 0  # ring bytes
    volume: int = 0  # gathered bytes (ring and direct)
    dtype: torch.dtype | None = None
    dedicated: bool = False  # larger than the ring and no destination: own buffer


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _parts_of(entry, param: torch.nn.Parameter, tp: int, dims) -> list[_Part]:
    """The HF tensors of one split megatron parameter as gather parts."""
    shape = tuple(param.shape)
    rows, rest = shape[0], shape[1:]
    names, kind = entry.hf_names, entry.kind

    def rowwise(name: str, r0: int, r1: int, hf_rows: int) -> _Part:
        return _Part(name, param, "rows", (r1 - r0, *rest), (hf_rows, *rest), rows=(r0, r1))

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
        return [
            _Part(name, param, "packed", (groups, b - a, *rest), (tp * groups * (b - a), *rest),
                  pack=lambda shard, a=a, b=b: shard.view(groups, width, *rest)[:, a:b])
            for name, (a, b) in zip(names, bounds)
        ]
    if kind == "split1":
        return [_Part(names[0], param, "cols", shape, (rows, tp * rest[0]), rows=(0, rows))]
    raise ValueError(f"unknown layout kind {kind!r}")


def _check_destination(part: _Part, dest: torch.Tensor) -> None:
    if tuple(dest.shape) != part.hf_shape or dest.dtype != part.dtype or not dest.is_contiguous():
        raise ValueError(
            f"weight sync destination for {part.hf_name!r} must be a contiguous {part.dtype} tensor "
            f"of shape {part.hf_shape}, got {tuple(dest.shape)} {dest.dtype}"
        )


def _schedule(plan, params, tp: int, dims, ring_bytes: int, destinations: Mapping[str, torch.Tensor]) -> list[_Bucket]:
    """Buckets in export order (see the module docstring for what goes where)."""
    from megarl.models.converters import is_split
    from megarl.models.weights import find_param

    target = max(_ALIGN, ring_bytes // 2)
    volume_cap = 2 * ring_bytes  # direct gathers need no ring: larger groups, fewer launches
    buckets: list[_Bucket] = []
    current = _Bucket()

    def close() -> None:
        nonlocal current
        if current.items:
            buckets.append(current)
        current = _Bucket()

    def add(make_item: Callable[[int], tuple], ring: int, volume: int, dtype) -> None:
        """Append ``make_item(ring offset)`` to the open bucket, or to a new one if full."""
        if current.items and (
            current.nbytes + ring > target or current.volume + volume > volume_cap or current.dtype not in (None, dtype)
        ):
            close()
        current.items.append(make_item(current.nbytes))
        current.nbytes += ring
        current.volume += volume
        current.dtype = dtype

    for entry in plan:
        param = find_param(params, entry.mcore_name)
        if param is None:
            raise ValueError(f"megatron parameter {entry.mcore_name!r} not found")
        if not is_split(entry.kind):
            current.items.append(("local", entry.hf_names[0], param))
            continue
        for part in _parts_of(entry, param, tp, dims):
            es = part.param.element_size()
            out_b = _align(tp * part.numel * es)
            dest = destinations.get(part.hf_name)
            if dest is not None:
                _check_destination(part, dest)
                if part.layout == "rows" and part.hf_shape[0] == tp * part.local_shape[0]:
                    # rank blocks of rows = the HF layout: gather straight into the destination
                    add(lambda off: ("direct", part, dest), 0, out_b, part.dtype)
                    continue
                row_b = _align(tp * part.row_numel * es)
                if part.layout != "packed" and row_b <= target:
                    n = part.local_shape[0]
                    if out_b <= target:
                        add(lambda off: ("ring", part, off, -1, (0, n), dest), out_b, out_b, part.dtype)
                        continue
                    close()
                    step = target // row_b
                    for a in range(0, n, step):
                        b = min(n, a + step)
                        size = _align(tp * (b - a) * part.row_numel * es)
                        buckets.append(_Bucket([("ring", part, 0, -1, (a, b), dest)], size, size, part.dtype))
                    continue
            extra = _align(part.numel * es) if part.layout == "packed" else (out_b if part.layout == "cols" else 0)
            size = out_b + extra
            if size > ring_bytes:
                close()
                buckets.append(_Bucket([("ring", part, 0, out_b if extra else -1, None, None)], size, size,
                                       part.dtype, dedicated=True))
                continue
            add(lambda off: ("ring", part, off, off + out_b if extra else -1, None, None), size, size, part.dtype)
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
            from torch.distributed.distributed_c10d import AllgatherOptions

            opts = AllgatherOptions()
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
    """One bucket with every view prebuilt: a sync copies ``packs`` (staging), launches
    one grouped gather, then runs ``copies`` (permutes, chunk placements) and yields."""

    packs: list = field(default_factory=list)  # (staging view, strided source view)
    outputs: list = field(default_factory=list)
    inputs: list = field(default_factory=list)
    copies: list = field(default_factory=list)  # (destination view, source view)
    yields: list = field(default_factory=list)  # (hf_name, tensor) in export order


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
        self.ready: list[_Ready | None] = []
        self.bases: list[int] = []
        self.destinations: Mapping[str, torch.Tensor] = {}
        params = {}
        for b in buckets:
            for i in b.items:
                p = i[2] if i[0] == "local" else i[1].param
                params[id(p)] = p
        self.params = list(params.values())

    def _key(self, destinations: Mapping[str, torch.Tensor]) -> tuple:
        """Storages the prebuilt views point at: parameters (moved by offload) and
        destinations."""
        return tuple(p.data_ptr() for p in self.params), tuple((n, t.data_ptr()) for n, t in destinations.items())

    def prepare(self, destinations: Mapping[str, torch.Tensor]) -> None:
        key = self._key(destinations)
        if key == self.key and self.ring is not None:
            return
        self.release()
        self.destinations = destinations
        self.ring = torch.empty(self.ring_bytes, dtype=torch.uint8, device=self.device)
        self.bases = self._place()
        # Buckets on a buffer of their own are built (allocated) at launch and dropped
        # once consumed: only the ring stays between exports.
        self.ready = [None if b.dedicated else self._build(b, base, destinations) for b, base in zip(self.buckets, self.bases)]
        self.key = key

    def release(self) -> None:
        """Drop the ring buffer and the views (the memory comes back)."""
        self.ring, self.ready, self.key = None, [], None

    def _place(self) -> list[int | None]:
        """Ring offset of each bucket: right after the previous one, or at the start if
        it fits before it; None = launched only after the previous one was consumed (at
        offset 0); dedicated buckets have their own buffer (-1)."""
        bases: list[int | None] = []
        prev_base, prev_size, prev_dedicated = 0, 0, False
        for b in self.buckets:
            if b.dedicated or not b.nbytes:
                # two own buffers at a time at most: the second waits for the first
                bases.append(None if b.dedicated and prev_dedicated else -1)
                prev_base, prev_size, prev_dedicated = 0, 0, b.dedicated
                continue
            prev_dedicated = False
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
        ready = _Ready()
        for item in bucket.items:
            if item[0] == "local":
                ready.yields.append((item[1], item[2].detach()))
                continue
            part = item[1]
            shard = part.param.detach()
            if item[0] == "direct":
                dest = item[2]
                ready.outputs.append(dest.view(-1))
                ready.inputs.append(shard[part.rows[0] : part.rows[1]].reshape(-1))
                ready.yields.append((part.hf_name, dest))
                continue
            _, part, out_off, extra_off, rng, dest = item
            es = part.param.element_size()
            n = part.local_shape[0]
            a, b = rng if rng is not None else (0, n)
            if part.layout == "packed":
                staging = buffer[extra_off : extra_off + part.numel * es].view(part.dtype)
                ready.packs.append((staging.view(part.local_shape), part.pack(shard)))
                local = staging
            else:
                r0 = part.rows[0]
                local = shard[r0 + a : r0 + b].reshape(-1)
            region = buffer[out_off : out_off + tp * local.numel() * es].view(part.dtype)
            ready.outputs.append(region)
            ready.inputs.append(local)
            rest = part.local_shape[1:]
            blocks = region.view(tp, b - a, *rest)  # [rank, rows, ...]
            if part.layout == "cols":
                cols = rest[0]
                if dest is None:
                    full = buffer[extra_off : extra_off + region.numel() * es].view(part.dtype).view(n, tp * cols)
                    ready.copies.append((full.view(n, tp, cols), blocks.transpose(0, 1)))
                    ready.yields.append((part.hf_name, full))
                else:
                    ready.copies.append((dest[a:b].view(b - a, tp, cols), blocks.transpose(0, 1)))
                    if b == n:
                        ready.yields.append((part.hf_name, dest))
                continue
            if part.layout == "packed":
                ready.yields.append((part.hf_name, region.view(part.hf_shape)))
                continue
            if dest is None:  # rank blocks of rows are the HF rows
                ready.yields.append((part.hf_name, region.view(tp * (b - a), *rest)[: part.hf_shape[0]]))
                continue
            for r in range(tp):  # rows chunk: rank r's rows land at r * n + a (vocab: minus padding)
                lo, hi = r * n + a, min(r * n + b, part.hf_shape[0])
                if hi > lo:
                    ready.copies.append((dest[lo:hi], blocks[r, : hi - lo]))
            if b == n:
                ready.yields.append((part.hf_name, dest))
        return ready

    def launch(self, k: int):
        if self.buckets[k].dedicated:
            self.ready[k] = self._build(self.buckets[k], -1, self.destinations)
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
            for dst, src in ready.copies:
                dst.copy_(src)
            yield from ready.yields
            if self.buckets[k].dedicated:
                self.ready[k] = ready = None
            if k + 1 < n and not nxt_launched:
                work = self.launch(k + 1)


_EXPORTERS: dict = {}  # (id(model), ring bytes, destination names) -> (weakref(model), _Exporter)


BUCKETED_KINDS = ("replicated", "split0", "split1", "vocab", "gate_up", "qkv")


def _bucketable(plan) -> bool:
    return all(entry.kind in BUCKETED_KINDS and not entry.stacked for entry in plan)


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
            the consumer lends: the tensor is written there (gathered straight in, or
            through the ring in row chunks) and that destination is yielded. Every TP
            rank must pass the same names (the schedule, hence the collectives,
            depends on them).
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
        or not _bucketable(build_plan(hf_config, unwrap_chunk(chunks[0]).config))
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
        from megarl.models.weights import converted_tensors, find_param

        params = converted_tensors(model)
        plan = [e for e in build_plan(hf_config, model.config, value_head=meta["value_head"]) if e.export]
        dims = dims_of(hf_config)
        for entry in plan:
            shard = find_param(params, entry.mcore_name).detach()
            yield from zip(entry.hf_names, from_shards(entry.kind, [shard], dims))
        return

    ring_bytes = _align(int(bucket_size_bytes))
    cache_key = (id(model), ring_bytes, tuple(sorted(destinations)))
    cached = _EXPORTERS.get(cache_key)
    exporter = cached[1] if cached is not None and cached[0]() is model else None
    if exporter is None:
        from megarl.models.weights import converted_tensors

        plan = [e for e in build_plan(hf_config, model.config, value_head=meta["value_head"]) if e.export]
        params = converted_tensors(model)
        buckets = _schedule(plan, params, tp, dims_of(hf_config), ring_bytes, destinations)
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
