"""LoRA adapters on Megatron-Core's tensor-parallel linear layers.

An adapted linear ``y = x W^T`` computes ``y + (alpha / r) * (x A^T) B^T``; W stays frozen and
only A ``[r, in]`` and B ``[out, r]`` train. The adapter is a child module ``lora`` of the linear
(``...linear_qkv.lora.A``), run by a forward hook, so the base parameters keep their names and
the HF converters, weight sync and exports see the same model.

Tensor parallelism (h = x A^T is ``[s, b, r]``, tiny next to x):

* column-parallel base (linear_qkv, linear_fc1; W sharded on out): A replicated, B sharded on
  out like W. Each rank's B-slice gives a partial dh, summed over TP in backward (megatron's
  ``copy_to_tensor_model_parallel_region``). Sequence parallel: x is this rank's sequence
  slice, h is all-gathered over the sequence (backward: reduce-scatter) and A's gradient, a
  sum over the sequence slices, is all-reduced over TP (``param.sequence_parallel``).
* row-parallel base (linear_proj, linear_fc2; W sharded on in): A sharded on in like W, B
  replicated; the partial h of each rank is all-reduced (sequence parallel: reduce-scattered,
  and B's gradient all-reduced over TP).

Transformer Engine's linears (the TE layer spec) are adapted alike: ``TEColumnParallelLinear`` and
``TERowParallelLinear`` as megatron's column / row linears; ``TELayerNormColumnParallelLinear`` takes the
un-normalised hidden state and normalises it inside its fused kernel, so the adapter's input is that
norm recomputed from the module's own weights (RMSNorm or LayerNorm, zero-centred gamma), in fp32, and
again in the backward pass (activation checkpointing: no extra memory but the adapter's ``[s, b, r]``).

MoE experts (megatron's ``SequentialMLP``: each local expert an MLP with its own linear_fc1 /
linear_fc2, megatron's or TE's linears; a LoRA build turns grouped GEMM off, megarl.workers.megatron.engine):
each expert's linear gets its own pair, named by the expert's global index (``...mlp.experts.local_experts.<e>``
with ``e = ep_rank * num_local_experts + local index``, so A's seed and the target patterns do not
depend on expert parallelism). An expert linear with expert tensor parallelism 1 is a plain local
matmul on the tokens routed to it (the dispatcher moves tokens, not activations of a shard), so
its adapter communicates nothing; A and B are expert-parallel parameters (``allreduce=False``:
their gradients are reduced over the expert data-parallel group, like the expert weights).
Expert tensor parallelism > 1 and TE's grouped experts (``TEGroupedMLP``, all experts in one
module) are refused.

Merged weight of a rank's shard: ``W_local + scale * B_local @ A_local`` (no communication; each
expert-parallel rank merges its own experts).
The reference policy is the base model: :func:`adapters_disabled`. Weight sync and HF export
see merged weights inside :func:`merged_weights`.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from megatron.core import parallel_state
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes
from megatron.core.tensor_parallel.mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
)
from megatron.core.transformer.mlp import apply_swiglu_sharded_factory
from megatron.core.transformer.moe.experts import SequentialMLP
from megatron.core.transformer.utils import make_tp_sharded_tensor_for_checkpoint
from torch.utils.checkpoint import checkpoint

__all__ = ["LoraSpec", "LoraAdapter", "apply_lora", "adapters", "adapters_disabled", "merged_weights", "ADAPTER_KEY"]

ADAPTER_KEY = ".lora."  # in every adapter parameter's name (and dist-checkpoint key)


@dataclass(frozen=True)
class LoraSpec:
    """The typed `actor_rollout_ref.model.lora` (rank > 0) plus the init seed."""

    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    exclude_modules: tuple[str, ...]
    a_init: str  # xavier | kaiming | normal
    seed: int

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @classmethod
    def from_config(cls, lora_cfg, seed: int) -> "LoraSpec | None":
        """None when `lora.rank` is 0 (full-parameter training)."""
        if int(lora_cfg.rank) == 0:
            return None
        return cls(int(lora_cfg.rank), float(lora_cfg.alpha), tuple(lora_cfg.target_modules),
                   tuple(lora_cfg.exclude_modules), str(lora_cfg.lora_A_init_method), int(seed))


TE_FUSED_NORM = "TELayerNormColumnParallelLinear"  # megatron-core's TE wrappers, by name (importing them needs
TE_COLUMN = ("TEColumnParallelLinear", TE_FUSED_NORM)  # transformer-engine)
TE_ROW = ("TERowParallelLinear",)


def _parallel_kind(module: torch.nn.Module) -> str | None:
    """"column" | "row" for a tensor-parallel linear (megatron's or TE's), None for another module;
    raises for grouped experts and TE's other linears (``TELinear``'s duplicated mode, untested here)."""
    name = type(module).__name__
    if isinstance(module, ColumnParallelLinear) or name in TE_COLUMN:
        return "column"
    if isinstance(module, RowParallelLinear) or name in TE_ROW:
        return "row"
    if "Grouped" in name:
        raise ValueError(
            f"actor_rollout_ref.model.lora: LoRA on grouped experts ({name}, every expert's weight in one module) is "
            "not implemented in megarl; remove actor_rollout_ref.actor.megatron.override_transformer_config."
            "moe_grouped_gemm (a LoRA build makes each expert an MLP of its own)"
        )
    if name.startswith("TE") and hasattr(module, "weight"):
        raise ValueError(f"actor_rollout_ref.model.lora: LoRA on transformer-engine's {name} is not implemented in "
                         "megarl; leave it out of actor_rollout_ref.model.lora.target_modules")
    return None


def _is_expert(name: str) -> bool:
    """Whether the linear of global name `name` belongs to one of a ``SequentialMLP``'s experts. Read from its
    place, not the module: TE's linears keep no ``is_expert`` and mark ``allreduce`` only when the experts have
    process groups of their own (megatron-core 0.19), so neither tells an expert linear at EP=1 from a dense one."""
    return ".local_experts." in name


def _fused_norm(base: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The norm TE's fused layernorm + linear applies to ``x`` before its GEMM, recomputed in fp32 from the
    module's own weights (frozen under LoRA; the gradient flows to x through it)."""
    weight = base.layer_norm_weight.float() + (1.0 if base.zero_centered_gamma else 0.0)
    xf = x.float()
    if base.normalization == "RMSNorm":
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + base.eps) * weight
    else:
        y = torch.nn.functional.layer_norm(xf, (xf.shape[-1],), weight, base.layer_norm_bias.float(), base.eps)
    return y.to(x.dtype)


def _normed_down(base: torch.nn.Module, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    return torch.matmul(_fused_norm(base, x), a.t())


def _init_a(shape: tuple[int, int], method: str, generator: torch.Generator) -> torch.Tensor:
    """A's full (unsharded) initial value ``[r, in]``, fp32 on CPU, from `generator`."""
    a = torch.empty(shape)
    if method == "xavier":
        return torch.nn.init.xavier_normal_(a, generator=generator)
    if method == "kaiming":
        return torch.nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)
    if method == "normal":
        return torch.nn.init.normal_(a, std=0.02, generator=generator)
    raise ValueError(f"actor_rollout_ref.model.lora.lora_A_init_method={method!r}; choose xavier, kaiming or normal")


class LoraAdapter(torch.nn.Module):
    """The low-rank pair of one tensor-parallel linear (see the module docstring); `name` its
    global name (the expert's global index in an expert linear's).

    Shapes on a rank with TP size t: column base ``W [out/t, in]``: ``A [r, in]``, ``B [out/t, r]``;
    row base ``W [out, in/t]``: ``A [r, in/t]``, ``B [out, r]``. An expert linear (expert TP 1):
    ``W [out, in]``, ``A [r, in]``, ``B [out, r]``.
    """

    def __init__(self, base: torch.nn.Module, kind: str, spec: LoraSpec, name: str, sequence_parallel: bool) -> None:
        super().__init__()
        weight = base.weight
        out_local, in_local = weight.shape
        self.expert = _is_expert(name)
        if self.expert and (etp := parallel_state.get_expert_tensor_parallel_world_size()) > 1:
            raise ValueError(f"actor_rollout_ref.model.lora: LoRA on {name} with expert tensor parallelism "
                             f"{etp} is not implemented in megarl; set "
                             "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1")
        tp, tp_rank = ((1, 0) if self.expert else (parallel_state.get_tensor_model_parallel_world_size(),
                                                   parallel_state.get_tensor_model_parallel_rank()))
        in_full = in_local * tp if kind == "row" else in_local
        # The same A on every layout: seeded by the layer's (global) name, drawn unsharded, sliced.
        seed = int.from_bytes(hashlib.sha256(f"{spec.seed}:{name}".encode()).digest()[:8], "little") & (2**63 - 1)
        a_full = _init_a((spec.rank, in_full), spec.a_init, torch.Generator().manual_seed(seed))
        a = a_full[:, tp_rank * in_local:(tp_rank + 1) * in_local] if kind == "row" else a_full
        self.A = torch.nn.Parameter(a.to(device=weight.device, dtype=weight.dtype).contiguous())
        self.B = torch.nn.Parameter(torch.zeros(out_local, spec.rank, device=weight.device, dtype=weight.dtype))
        self.name = name
        if self.expert:  # replicated over the (size 1) expert TP group, reduced over expert data parallelism
            for param in (self.A, self.B):
                set_tensor_model_parallel_attributes(param, False, 0, 1)
                param.allreduce = False
            self.tp_axis = {"A": None, "B": None}
        else:
            sharded, replicated, axis = (self.B, self.A, 0) if kind == "column" else (self.A, self.B, 1)
            set_tensor_model_parallel_attributes(sharded, True, axis, 1)
            set_tensor_model_parallel_attributes(replicated, False, 0, 1)
            # a sum over sequence slices (sequence parallel): megatron all-reduces it over TP
            replicated.sequence_parallel = sequence_parallel and tp > 1
            self.tp_axis = {"A": None, "B": 0} if kind == "column" else {"A": 1, "B": None}
        # a gated fc1's rows are [gate; up] per TP rank, checkpointed as two TP-sharded halves (as megatron's W)
        self.gated_rows = (kind == "column" and name.endswith("linear_fc1") and bool(base.config.gated_linear_unit)
                           and not self.expert)
        self.kind = kind
        self.fused_norm = type(base).__name__ == TE_FUSED_NORM  # x arrives un-normalised (see forward)
        self.scale = spec.scale
        self.sequence_parallel = sequence_parallel and not self.expert
        self.enabled = True

    def forward(self, x: torch.Tensor, norm_of: torch.nn.Module | None = None) -> torch.Tensor:
        """The adapter's addition to the base output. x: the base layer's input (column:
        ``[s(/t), b, in]``, row: ``[s, b, in/t]``); returns the base output's shape. ``norm_of``: TE's
        fused layernorm + linear whose norm applies to x first; that norm and A's matmul run again in
        the backward pass, so only x (which TE keeps anyway) is saved, not fp32 copies of ``[s, b, in]``."""
        if norm_of is None:
            h = torch.matmul(x, self.A.t())  # [.., b, r]
        else:
            h = checkpoint(_normed_down, norm_of, x, self.A, use_reentrant=False)
        if self.expert:  # x: [tokens routed to this expert, in]; a local matmul, as the expert's W
            return torch.matmul(h, self.B.t()) * self.scale
        if self.kind == "column":
            h = gather_from_sequence_parallel_region(h) if self.sequence_parallel else copy_to_tensor_model_parallel_region(h)
        else:
            h = reduce_scatter_to_sequence_parallel_region(h) if self.sequence_parallel else reduce_from_tensor_model_parallel_region(h)
        return torch.matmul(h, self.B.t()) * self.scale

    @torch.no_grad()
    def delta(self) -> torch.Tensor:
        """``scale * B @ A``: this rank's shard of the weight update, W's local shape and dtype
        (computed in fp32)."""
        return (self.B.float() @ self.A.float() * self.scale).to(self.B.dtype)


def _hook(module, args, output):
    adapter: LoraAdapter = module.lora
    if not adapter.enabled:
        return output
    out, bias = output
    return out + adapter(args[0], module if adapter.fused_norm else None), bias


def _sharded_state_dict_with_adapter(base: torch.nn.Module, original):
    """The base layer's sharded state dict with the adapter's TP-sharded tensor cut on its axis
    (megatron's would checkpoint it as replicated), a gated fc1's B split like megatron's W."""

    def sharded_state_dict(prefix: str = "", sharded_offsets=(), metadata=None):
        out = original(prefix, sharded_offsets, metadata)
        adapter = base.lora
        for pname, axis in adapter.tp_axis.items():
            if axis is not None:
                key = f"{prefix}lora.{pname}"
                out[key] = make_tp_sharded_tensor_for_checkpoint(getattr(adapter, pname), key, axis,
                                                                prepend_offsets=sharded_offsets)
                if adapter.gated_rows:
                    out[key] = apply_swiglu_sharded_factory(out[key], sharded_offsets,
                                                            (metadata or {}).get("singleton_local_shards", False))
        return out

    return sharded_state_dict


def _matches(name: str, patterns: Sequence[str]) -> bool:
    last = name.rsplit(".", 1)[-1]
    return any(last == p or fnmatch.fnmatchcase(name, p) for p in patterns)


def _global_linears(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module]]:
    """(``decoder.layers.<global layer index>.<path>``, module) of every decoder submodule, an
    expert's ``local_experts.<i>`` numbered by its global expert index: names independent of the
    pipeline and expert-parallel layout."""
    for layer in model.decoder.layers:
        offsets = {f"{path}.local_experts": m.ep_group.rank() * m.num_local_experts
                   for path, m in layer.named_modules() if isinstance(m, SequentialMLP)}

        def global_expert(match: re.Match) -> str:
            return f"{match[1]}.{offsets[match[1]] + int(match[2])}"

        for path, module in layer.named_modules():
            if path:
                path = re.sub(r"^(.*\.local_experts)\.(\d+)", global_expert, path)
                yield f"decoder.layers.{layer.layer_number - 1}.{path}", module


def apply_lora(model: torch.nn.Module, spec: LoraSpec) -> list[str]:
    """Freeze every parameter of `model` (a GPTModel chunk with its weights loaded) and add
    adapters to the linears `spec` targets. Returns the adapted layers' global names.

    Raises ValueError naming `actor_rollout_ref.model.lora.*` for a target name no layer has, a
    targeted linear megarl cannot adapt (grouped experts, expert TP > 1), or targets that leave
    nothing adapted."""
    for param in model.parameters():
        param.requires_grad_(False)
    sequence_parallel = bool(model.config.sequence_parallel)
    linears = list(_global_linears(model))
    present = {name.rsplit(".", 1)[-1] for name, module in linears}
    unknown = [t for t in spec.target_modules if not any(c in t for c in "*?[") and t not in present]
    if unknown:
        tp_linears = sorted({n.rsplit(".", 1)[-1] for n, m in linears if isinstance(m, (ColumnParallelLinear, RowParallelLinear))
                             or type(m).__name__ in TE_COLUMN + TE_ROW})
        raise ValueError(f"actor_rollout_ref.model.lora.target_modules: {unknown} name no layer of this model; "
                         f"its linear layers are {tp_linears}")
    adapted = []
    for name, module in linears:
        if not _matches(name, spec.target_modules) or _matches(name, spec.exclude_modules):
            continue
        kind = _parallel_kind(module)
        if kind is None and name.rsplit(".", 1)[-1] not in spec.target_modules:
            continue  # a pattern also covers the layer's other modules: it adapts the linears among them
        if kind is None:
            raise ValueError(f"actor_rollout_ref.model.lora.target_modules: {name} is a {type(module).__name__}, "
                             "not a tensor-parallel linear; target linear_qkv, linear_proj, linear_fc1, linear_fc2")
        module.lora = LoraAdapter(module, kind, spec, name, sequence_parallel)
        module.register_forward_hook(_hook)
        module.sharded_state_dict = _sharded_state_dict_with_adapter(module, module.sharded_state_dict)
        adapted.append(name)
    if not adapted and linears:
        raise ValueError(f"actor_rollout_ref.model.lora: target_modules {list(spec.target_modules)} minus exclude_modules "
                         f"{list(spec.exclude_modules)} leave no layer of this model (pipeline stage) adapted")
    return adapted


def adapters(chunks: Sequence[torch.nn.Module]) -> list[tuple[torch.nn.Module, LoraAdapter]]:
    """(base linear, adapter) pairs of every chunk (DDP / Float16Module wrappers are fine)."""
    return [(m, m.lora) for c in chunks for m in c.modules() if isinstance(getattr(m, "lora", None), LoraAdapter)]


@contextlib.contextmanager
def adapters_disabled(chunks: Sequence[torch.nn.Module]):
    """The base model for the block (the LoRA reference policy), adapters back on after it."""
    pairs = adapters(chunks)
    for _, adapter in pairs:
        adapter.enabled = False
    try:
        yield
    finally:
        for _, adapter in pairs:
            adapter.enabled = True


@contextlib.contextmanager
def merged_weights(chunks: Sequence[torch.nn.Module]):
    """Each adapted linear's ``weight`` holds ``W + scale * B @ A`` for the block (exports, weight
    sync) and its adapter is off (a forward inside equals the adapted model's). The base tensors
    are put back unchanged (bitwise) after it. Peak memory: one extra copy of the adapted weights."""
    pairs = adapters(chunks)
    saved = []
    try:
        for base, adapter in pairs:
            saved.append((base, adapter, base.weight.data))
            base.weight.data = base.weight.data + adapter.delta()
            adapter.enabled = False
        yield
    finally:
        for base, adapter, data in saved:
            base.weight.data = data
            adapter.enabled = True
