"""Resharding plan: Megatron (TP/PP/EP) shards -> HF tensors -> vLLM, in buckets.

A :class:`ReshardPlan` is computed once per (Megatron layout, rollout TP, bucket
size, dtype) from metadata only (no weights, no process groups). For every HF tensor
vLLM loads, in the exporter's order, it records

* its Megatron source, taken from the placement plan of ``megarl.models``
  (:class:`megarl.models.converters.ParamSource`, the one place that knows it): the
  megatron parameter, its layout kind (``qkv`` = GQA-interleaved fused QKV,
  ``gate_up`` = fused gate/up, ``split0``/``split1`` = column/row parallel, ``vocab``,
  ``replicated``), the group its shards are split over (TP, or ETP for experts), the
  pipeline rank and VPP chunk holding it, the EP rank of a routed expert, and the
  tensor's position among the HF tensors fused into that parameter;
* which bucket carries it and at which byte offset: buckets are filled greedily in
  export order up to ``bucket_size_bytes`` (a larger tensor gets a bucket of its own),
  offsets 16-byte aligned, so senders and receivers agree on the layout without
  shipping metadata per iteration.

The exporter (``megarl.models.export_hf_weights``) gathers each megatron parameter
over its TP/ETP group, broadcasts it from its EP rank / pipeline stage and splits the
fused tensors, in exactly this order. A vLLM target with TP > 1 receives full HF
tensors and slices them with vLLM's own weight loaders (each rank of a vLLM TP group
runs in a Megatron rank's process and takes its slice locally; no bytes move for it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Collection, Mapping, Sequence

import torch

from megarl.parallel.layout import ParallelLayout

ALIGN_BYTES = 16


@dataclass(frozen=True)
class TensorSlot:
    """One HF tensor in a bucket. ``offset``/``nbytes`` in bytes.

    ``source`` is the megatron parameter it comes from (a ``ParamSource`` of
    ``megarl.models.converters``; None in plans built from names only) and
    ``fused_index`` its position among that parameter's HF tensors.
    """

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int
    nbytes: int
    source: Any = None
    fused_index: int = 0


@dataclass(frozen=True)
class BucketPlan:
    index: int
    slots: tuple[TensorSlot, ...]
    nbytes: int  # padded size of the bucket buffer

    @property
    def names(self) -> list[str]:
        return [slot.name for slot in self.slots]


@dataclass(frozen=True)
class ReshardPlan:
    layout: ParallelLayout
    rollout_tp: int
    bucket_size_bytes: int
    buckets: tuple[BucketPlan, ...]
    slot_index: Mapping[str, tuple[int, int]] = field(repr=False)  # name -> (bucket, slot)

    @property
    def total_bytes(self) -> int:
        return sum(slot.nbytes for b in self.buckets for slot in b.slots)

    @property
    def num_tensors(self) -> int:
        return len(self.slot_index)

    @property
    def max_bucket_bytes(self) -> int:
        return max((b.nbytes for b in self.buckets), default=0)

    def slot(self, name: str) -> tuple[BucketPlan, TensorSlot]:
        if name not in self.slot_index:
            raise KeyError(
                f"weight sync: tensor {name!r} is not in the resharding plan "
                f"({self.num_tensors} tensors); the export and the plan disagree"
            )
        b, s = self.slot_index[name]
        return self.buckets[b], self.buckets[b].slots[s]

    def describe(self) -> str:
        """Header plus one line per bucket: index, bytes, first..last tensor."""
        lines = [
            f"ReshardPlan megatron={self.layout} rollout_tp={self.rollout_tp} "
            f"tensors={self.num_tensors} bytes={self.total_bytes} buckets={len(self.buckets)}"
        ]
        for b in self.buckets:
            lines.append(f"  bucket {b.index}: {b.nbytes} B, {b.slots[0].name} .. {b.slots[-1].name}")
        return "\n".join(lines)


def _align(n: int) -> int:
    return (n + ALIGN_BYTES - 1) // ALIGN_BYTES * ALIGN_BYTES


def build_plan(
    param_meta: Sequence[tuple[str, Sequence[int], torch.dtype]],
    *,
    layout: ParallelLayout = ParallelLayout(world_size=1),
    rollout_tp: int = 1,
    bucket_size_bytes: int,
    sources: Mapping[str, tuple[Any, int]] | None = None,
) -> ReshardPlan:
    """Bucket tensors ``param_meta = [(hf_name, shape, dtype)]`` in the given order.

    ``sources`` maps an HF name to ``(ParamSource, fused_index)``.

    Raises:
        ValueError: ``bucket_size_bytes <= 0`` (names the config key) or a duplicate name.
    """
    if bucket_size_bytes <= 0:
        raise ValueError(
            "actor_rollout_ref.rollout.weight_sync.bucket_size_mb must be > 0, got "
            f"{bucket_size_bytes / 2**20} MiB"
        )
    buckets: list[BucketPlan] = []
    current: list[TensorSlot] = []
    used = 0

    def close() -> None:
        nonlocal current, used
        if current:
            buckets.append(BucketPlan(len(buckets), tuple(current), _align(used)))
        current, used = [], 0

    seen: set[str] = set()
    for name, shape, dtype in param_meta:
        if name in seen:
            raise ValueError(f"weight sync plan: tensor {name!r} appears twice")
        seen.add(name)
        shape = tuple(int(s) for s in shape)
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        offset = _align(used)
        if current and offset + nbytes > bucket_size_bytes:
            close()
            offset = 0
        source, fused_index = (sources or {}).get(name, (None, 0))
        current.append(TensorSlot(name, shape, dtype, offset, nbytes, source, fused_index))
        used = offset + nbytes
    close()
    index = {slot.name: (b.index, i) for b in buckets for i, slot in enumerate(b.slots)}
    return ReshardPlan(layout, int(rollout_tp), int(bucket_size_bytes), tuple(buckets), index)


def checkpoint_shapes(hf_dir: str) -> dict[str, tuple[int, ...]]:
    """``hf_name -> shape`` from the safetensors headers in ``hf_dir`` (no tensor data
    is read). The checkpoint's naming is what vLLM loads (e.g. one tensor per expert,
    where transformers may fuse experts in memory)."""
    from pathlib import Path

    from safetensors import safe_open

    files = sorted(Path(hf_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"weight sync plan: no *.safetensors in {hf_dir} (actor_rollout_ref.model.path)")
    shapes: dict[str, tuple[int, ...]] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                shapes[name] = tuple(handle.get_slice(name).get_shape())
    return shapes


def plan_for_model(
    hf_config,
    transformer_config,
    hf_dir: str,
    *,
    world_size: int,
    rollout_tp: int,
    bucket_size_bytes: int,
    dtype: torch.dtype,
    experts: Collection[int] | None = None,
) -> ReshardPlan:
    """The plan for a megatron model built by ``megarl.models.build_model``.

    Tensor order and sources come from ``megarl.models.converters.build_plan`` (the
    export order), shapes from the checkpoint headers in ``hf_dir``; ``dtype`` is the
    rollout engine's dtype (exported tensors are cast to it on the sender);
    ``world_size``: ranks of the model's Megatron world. ``experts``: only these routed experts
    (global ids; an engine with expert parallelism loads its own), as ``export_hf_weights(experts=...)``.

    Raises:
        ValueError: the placement plan names an HF tensor the HF model does not have.
    """
    from megarl.models.converters import build_plan as placement_plan

    shapes = checkpoint_shapes(hf_dir)
    meta, sources = [], {}
    for source in placement_plan(hf_config, transformer_config):
        if not source.export or (experts is not None and source.expert is not None and source.expert not in experts):
            continue
        for fused_index, name in enumerate(source.hf_names):
            if name not in shapes:
                raise ValueError(
                    f"weight sync plan: megatron parameter {source.mcore_name!r} maps to HF "
                    f"tensor {name!r}, which the checkpoint in {hf_dir} does not have"
                )
            meta.append((name, shapes[name], dtype))
            sources[name] = (source, fused_index)
    return build_plan(
        meta,
        layout=ParallelLayout.from_megatron_config(transformer_config, world_size),
        rollout_tp=rollout_tp,
        bucket_size_bytes=bucket_size_bytes,
        sources=sources,
    )
