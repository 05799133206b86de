"""Resharding plan: Megatron (TP/PP/EP) shards -> HF tensors -> vLLM, in buckets.

A :class:`ReshardPlan` is computed once per (Megatron layout, rollout TP, bucket
size) from parameter metadata only (names, shapes, dtypes: no weights). It fixes,
for every HF parameter vLLM loads,

* where it comes from in Megatron: the pipeline stage(s) that hold it (embeddings on
  the first stage, final norm / lm_head on the last, both for tied embeddings;
  decoder layer ``l`` on the stage that owns it under the interleaved VPP split) and,
  for routed experts, the expert-parallel rank and local expert index;
* which bucket carries it and at which byte offset. Buckets are filled greedily in
  export order up to ``bucket_size_bytes`` (a tensor larger than that gets a bucket
  of its own), offsets 16-byte aligned, so sender and receivers agree on the layout
  without shipping metadata per iteration.

How a full HF tensor is assembled from TP shards (column/row splits, fused QKV with
GQA interleaving, fused gate/up) is the per-architecture table in ``megarl.models``
(``export_hf_weights``), the one place that knows it; vLLM TP > 1 targets receive
full HF tensors and slice them with vLLM's own weight loaders.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import torch

ALIGN_BYTES = 16
_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_EXPERT_RE = re.compile(r"\.experts\.(\d+)\.")


@dataclass(frozen=True)
class MegatronLayout:
    """Megatron parallel sizes that decide where a parameter lives."""

    tp: int = 1
    pp: int = 1
    vpp: int | None = None
    ep: int = 1

    @classmethod
    def from_megatron_cfg(cls, megatron_cfg: Mapping[str, Any]) -> "MegatronLayout":
        get = megatron_cfg.get
        return cls(
            tp=int(get("tensor_model_parallel_size", 1) or 1),
            pp=int(get("pipeline_model_parallel_size", 1) or 1),
            vpp=get("virtual_pipeline_model_parallel_size", None),
            ep=int(get("expert_model_parallel_size", 1) or 1),
        )


@dataclass(frozen=True)
class TensorSlot:
    """One HF tensor in a bucket. ``offset``/``nbytes`` in bytes."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int
    nbytes: int
    pp_stages: tuple[int, ...]
    ep_rank: int | None = None
    local_expert: int | None = None
    mcore_name: str | None = None  # megatron parameter (local layer index) it comes from
    tp_kind: str | None = None  # megarl.models layout kind: replicated/split0/split1/vocab/qkv/gate_up
    fused_index: int = 0  # position among the HF tensors fused into mcore_name (q,k,v / gate,up)


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
    layout: MegatronLayout
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
        """One line per bucket: index, bytes, first..last tensor."""
        lines = [
            f"ReshardPlan megatron={self.layout} rollout_tp={self.rollout_tp} "
            f"tensors={self.num_tensors} bytes={self.total_bytes} buckets={len(self.buckets)}"
        ]
        for b in self.buckets:
            lines.append(f"  bucket {b.index}: {b.nbytes} B, {b.slots[0].name} .. {b.slots[-1].name}")
        return "\n".join(lines)


def _align(n: int) -> int:
    return (n + ALIGN_BYTES - 1) // ALIGN_BYTES * ALIGN_BYTES


def layer_pp_stage(layer: int, num_layers: int, layout: MegatronLayout) -> int:
    """Pipeline stage holding decoder layer ``layer`` (even split, interleaved VPP)."""
    chunks = layout.pp * (layout.vpp or 1)
    if num_layers % chunks:
        raise ValueError(
            f"num_hidden_layers={num_layers} is not divisible by pipeline_model_parallel_size"
            f" * virtual_pipeline_model_parallel_size = {chunks}"
        )
    return (layer // (num_layers // chunks)) % layout.pp


def param_source(
    name: str, num_layers: int, num_experts: int | None, layout: MegatronLayout, tied: bool
) -> tuple[tuple[int, ...], int | None, int | None]:
    """``(pp_stages, ep_rank, local_expert)`` of HF parameter ``name``."""
    ep_rank = local_expert = None
    layer = _LAYER_RE.search(name)
    if layer is not None:
        stages: tuple[int, ...] = (layer_pp_stage(int(layer.group(1)), num_layers, layout),)
        expert = _EXPERT_RE.search(name)
        if expert is not None and num_experts:
            per_rank = num_experts // layout.ep
            ep_rank, local_expert = divmod(int(expert.group(1)), per_rank)
    elif "embed_tokens" in name:
        stages = (0, layout.pp - 1) if tied and layout.pp > 1 else (0,)
    else:  # final norm, lm_head
        stages = (layout.pp - 1,)
    return stages, ep_rank, local_expert


def build_plan(
    param_meta: Sequence[tuple[str, Sequence[int], torch.dtype]],
    *,
    sources: Mapping[str, tuple[str, str, int]] | None = None,
    layout: MegatronLayout,
    rollout_tp: int,
    bucket_size_bytes: int,
    num_layers: int,
    num_experts: int | None = None,
    tied_embeddings: bool = False,
) -> ReshardPlan:
    """Plan for tensors ``param_meta`` = ``[(hf_name, shape, dtype)]`` in export order."""
    if bucket_size_bytes <= 0:
        raise ValueError(
            f"actor_rollout_ref.rollout.weight_sync.bucket_size_mb must be > 0, got "
            f"{bucket_size_bytes / 2**20} MiB"
        )
    if num_experts and num_experts % layout.ep:
        raise ValueError(f"num_experts={num_experts} not divisible by expert_model_parallel_size={layout.ep}")
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
            raise ValueError(f"weight sync plan: tensor {name!r} appears twice in the export")
        seen.add(name)
        shape = tuple(int(s) for s in shape)
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        offset = _align(used)
        if current and offset + nbytes > bucket_size_bytes:
            close()
            offset = 0
        stages, ep_rank, local_expert = param_source(name, num_layers, num_experts, layout, tied_embeddings)
        mcore_name, tp_kind, fused_index = (sources or {}).get(name, (None, None, 0))
        current.append(
            TensorSlot(
                name, shape, dtype, offset, nbytes, stages, ep_rank, local_expert,
                mcore_name, tp_kind, fused_index,
            )
        )
        used = offset + nbytes
    close()
    index = {slot.name: (b.index, i) for b in buckets for i, slot in enumerate(b.slots)}
    return ReshardPlan(layout, int(rollout_tp), int(bucket_size_bytes), tuple(buckets), index)


def hf_param_meta(hf_config, dtype: torch.dtype) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """``[(hf_name, shape, dtype)]`` of the HF model for ``hf_config``, built on the meta
    device (no memory). Tied embeddings appear once (``embed_tokens``)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config, torch_dtype=dtype)
    return [(name, tuple(p.shape), dtype) for name, p in model.named_parameters()]


def plan_for_hf_config(
    hf_config, layout: MegatronLayout, rollout_tp: int, bucket_size_bytes: int, dtype: torch.dtype,
    order: Iterable[str] | None = None,
) -> ReshardPlan:
    """:func:`build_plan` for an HF config, tensors in the order of the architecture
    table of ``megarl.models`` (embedding, layer by layer with its experts, final norm,
    lm_head) unless ``order`` (names, e.g. observed from the exporter) says otherwise;
    following the exporter's order keeps one bucket open at a time."""
    meta = hf_param_meta(hf_config, dtype)
    sources = table_sources(hf_config)
    rank = {name: i for i, name in enumerate(order if order is not None else sources)}
    meta.sort(key=lambda m: rank.get(m[0], len(rank)))
    return build_plan(
        meta,
        sources=sources,
        layout=layout,
        rollout_tp=rollout_tp,
        bucket_size_bytes=bucket_size_bytes,
        num_layers=int(hf_config.num_hidden_layers),
        num_experts=getattr(hf_config, "num_experts", None) or getattr(hf_config, "num_local_experts", None),
        tied_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
    )


def table_sources(hf_config) -> dict[str, tuple[str, str, int]]:
    """``hf_name -> (megatron name, layout kind, index among fused HF tensors)`` from
    the per-architecture table in ``megarl.models.converters.tables``, in table order
    (megatron names use the global layer index here)."""
    from megarl.models.converters.tables import arch_tables

    tables = arch_tables(hf_config)
    num_layers = int(hf_config.num_hidden_layers)
    num_experts = getattr(hf_config, "num_experts", None) or 0
    out: dict[str, tuple[str, str, int]] = {}

    def add(rule, **fmt) -> None:
        for i, hf in enumerate(rule.hf):
            out[hf.format(**fmt)] = (rule.mcore.format(**fmt), rule.kind, i)

    for rule in tables.first:
        add(rule)
    for layer in range(num_layers):
        for rule in tables.layer:
            add(rule, layer=layer)
        for expert in range(num_experts):
            for rule in tables.expert:
                add(rule, layer=layer, expert=expert)
    for rule in tables.last:
        add(rule)
    return out
