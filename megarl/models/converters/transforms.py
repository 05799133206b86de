"""HF full tensors <-> one tensor-parallel shard of a megatron parameter.

Pure functions, one pair per layout kind. ``to_shard`` takes the full HF tensors of one
megatron parameter and returns tensor-parallel rank ``rank``'s shard; ``from_shards``
takes every rank's shard (ordered by rank) and returns the full HF tensors.

Kinds:
  * ``replicated`` - same tensor on every TP rank (norms, router, value head).
  * ``split0`` / ``split1`` - split along dim 0 (column parallel) / dim 1 (row parallel).
  * ``vocab``  - split0 after padding rows to a multiple of the TP size (embedding,
    LM head); padded rows are zero in megatron and dropped on export.
  * ``qkv``    - HF q, k, v fused into megatron's linear_qkv: rows grouped by query
    group, each group ``[q heads of the group; k; v]`` (GQA interleaving), then split0.
  * ``gate_up`` - HF gate, up fused into linear_fc1: each TP shard is
    ``[gate shard; up shard]``.
  * ``gate_up_interleaved`` - one HF tensor whose last dim holds gate and up interleaved
    (GPT-OSS's ``gate_up_proj`` ``[hidden, 2I]`` and its bias ``[2I]``): megatron's linear_fc1 is its
    transpose with the gate rows first, then ``gate_up``.
  * ``split1_transposed`` - HF holds the transpose of megatron's row-parallel weight (GPT-OSS's
    ``down_proj`` ``[I, hidden]`` of linear_fc2 ``[hidden, I]``), then ``split1``.
  * ``qkv_gated`` - attention with an output gate: HF q_proj holds each head's query then its gate
    (``[heads * 2 * head_dim, ...]``), k, v as ``qkv``; megatron's linear_qkv holds per query group
    ``[queries; gates; k; v]`` of the group, then split0.
  * ``gdn_in_proj`` - a gated DeltaNet's input projection: HF ``in_proj_qkv`` (q, k, v), ``in_proj_z``,
    ``in_proj_b``, ``in_proj_a``; each TP shard is ``[q; k; v; z; b; a]`` of its heads.
  * ``gdn_in_proj_grouped`` - the same from Qwen3-Next's ``in_proj_qkvz`` (per key head: its q, k, then the v
    and z of its value heads) and ``in_proj_ba`` (per key head: the b, then the a of its value heads).
  * ``gdn_conv`` - its convolution over q/k/v channels (HF ``[q; k; v]``): each TP shard ``[q; k; v]`` of its heads.
  * ``mamba_in_proj`` - a Mamba-2 mixer's input projection (HF rows ``[z; x; B; C; dt]``): each TP shard
    ``[z; x; B; C; dt]`` of its heads and groups.
  * ``mamba_conv`` - its convolution weight / bias over x/B/C channels: each TP shard ``[x; B; C]`` of its part.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

KINDS = ("replicated", "split0", "split1", "vocab", "qkv", "gate_up", "gate_up_interleaved", "split1_transposed",
         "qkv_gated", "gdn_in_proj", "gdn_in_proj_grouped", "gdn_conv", "mamba_in_proj", "mamba_conv")


@dataclass(frozen=True)
class Dims:
    """Model sizes the transforms need: heads, query groups, head dim, HF vocab size."""

    num_heads: int
    num_query_groups: int
    head_dim: int
    vocab_size: int
    gdn_key_dim: int = 0  # gated DeltaNet: linear_num_key_heads * linear_key_head_dim
    gdn_value_dim: int = 0  # linear_num_value_heads * linear_value_head_dim
    gdn_key_heads: int = 0  # linear_num_key_heads
    gdn_value_heads: int = 0  # linear_num_value_heads
    mamba_inner: int = 0  # Mamba-2: mamba_num_heads * mamba_head_dim (z, x rows)
    mamba_bc: int = 0  # n_groups * ssm_state_size (B, C rows)
    mamba_heads: int = 0  # mamba_num_heads (dt rows)


def _qkv_fuse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dims: Dims) -> torch.Tensor:
    groups, hd = dims.num_query_groups, dims.head_dim
    per_group = dims.num_heads // groups
    rest = q.shape[1:]
    fused = torch.cat(
        [
            q.reshape(groups, per_group * hd, *rest),
            k.reshape(groups, hd, *rest),
            v.reshape(groups, hd, *rest),
        ],
        dim=1,
    )
    return fused.reshape(groups * (per_group + 2) * hd, *rest)


def _qkv_split(fused: torch.Tensor, dims: Dims) -> list[torch.Tensor]:
    groups, hd = dims.num_query_groups, dims.head_dim
    per_group = dims.num_heads // groups
    rest = fused.shape[1:]
    grouped = fused.reshape(groups, (per_group + 2) * hd, *rest)
    q, k, v = torch.split(grouped, [per_group * hd, hd, hd], dim=1)
    return [
        q.reshape(groups * per_group * hd, *rest).contiguous(),
        k.reshape(groups * hd, *rest).contiguous(),
        v.reshape(groups * hd, *rest).contiguous(),
    ]


def _gated_qkv_fuse(q_gate: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dims: Dims) -> torch.Tensor:
    groups, hd = dims.num_query_groups, dims.head_dim
    per_group = dims.num_heads // groups
    rest = q_gate.shape[1:]
    pairs = q_gate.reshape(dims.num_heads, 2, hd, *rest)
    q, gate = (pairs[:, i].reshape(groups, per_group * hd, *rest) for i in (0, 1))
    fused = torch.cat([q, gate, k.reshape(groups, hd, *rest), v.reshape(groups, hd, *rest)], dim=1)
    return fused.reshape(-1, *rest)


def _gated_qkv_split(fused: torch.Tensor, dims: Dims) -> list[torch.Tensor]:
    groups, hd = dims.num_query_groups, dims.head_dim
    per_group = dims.num_heads // groups
    rest = fused.shape[1:]
    q, gate, k, v = torch.split(fused.reshape(groups, (2 * per_group + 2) * hd, *rest),
                                [per_group * hd, per_group * hd, hd, hd], dim=1)
    q_gate = torch.stack([q.reshape(dims.num_heads, hd, *rest), gate.reshape(dims.num_heads, hd, *rest)], dim=1)
    return [q_gate.reshape(-1, *rest).contiguous(), k.reshape(-1, *rest).contiguous(), v.reshape(-1, *rest).contiguous()]


def _gdn_sections(dims: Dims) -> list[int]:
    """HF rows of in_proj_qkv / conv1d: q, k, v."""
    return [dims.gdn_key_dim, dims.gdn_key_dim, dims.gdn_value_dim]


def _mamba_sections(kind: str, dims: Dims) -> list[int]:
    """HF rows of a Mamba-2 in_proj (z, x, B, C, dt) or conv1d (x, B, C)."""
    inner, bc = dims.mamba_inner, dims.mamba_bc
    return [inner, inner, bc, bc, dims.mamba_heads] if kind == "mamba_in_proj" else [inner, bc, bc]


def _gdn_ungroup(qkvz: torch.Tensor, ba: torch.Tensor, dims: Dims) -> list[torch.Tensor]:
    """Qwen3-Next's key-head-grouped projections -> q, k, v, z, b, a (rows as Qwen3.5's split projections)."""
    nk, rest = dims.gdn_key_heads, qkvz.shape[1:]
    ratio, dk = dims.gdn_value_heads // nk, dims.gdn_key_dim // nk
    dv = dims.gdn_value_dim // dims.gdn_value_heads
    q, k, v, z = torch.split(qkvz.reshape(nk, -1, *rest), [dk, dk, ratio * dv, ratio * dv], dim=1)
    b, a = torch.split(ba.reshape(nk, 2 * ratio, *rest), [ratio, ratio], dim=1)
    return [t.reshape(-1, *rest) for t in (q, k, v, z, b, a)]


def _gdn_group(q, k, v, z, b, a, dims: Dims) -> list[torch.Tensor]:
    nk, rest = dims.gdn_key_heads, q.shape[1:]
    per_head = [t.reshape(nk, -1, *rest) for t in (q, k, v, z, b, a)]
    return [torch.cat(per_head[:4], dim=1).reshape(-1, *rest), torch.cat(per_head[4:], dim=1).reshape(-1, *rest)]


def _per_rank_cat(parts: list[torch.Tensor], rank: int, size: int) -> torch.Tensor:
    return torch.cat([part.chunk(size, dim=0)[rank] for part in parts], dim=0)


def _per_rank_split(shards: list[torch.Tensor], full_rows: list[int]) -> list[torch.Tensor]:
    """Inverse of :func:`_per_rank_cat` over every rank's shard: the full parts of ``full_rows`` rows."""
    size = len(shards)
    pieces = [torch.split(shard, [rows // size for rows in full_rows], dim=0) for shard in shards]
    return [torch.cat([piece[i] for piece in pieces], dim=0) for i in range(len(full_rows))]


def _deinterleave(hf: torch.Tensor) -> list[torch.Tensor]:
    """HF gate/up interleaved along the last dim -> [gate, up], each ``[I, *rest]`` (rows = megatron's)."""
    rows = hf.movedim(-1, 0)
    return [rows[0::2], rows[1::2]]


def _interleave(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    rows = torch.empty((2 * gate.shape[0], *gate.shape[1:]), dtype=gate.dtype, device=gate.device)
    rows[0::2], rows[1::2] = gate, up
    return rows.movedim(0, -1).contiguous()


def to_shard(kind: str, hf: list[torch.Tensor], rank: int, size: int, dims: Dims) -> torch.Tensor:
    """Full HF tensor(s) -> TP rank ``rank`` of ``size``'s shard of the megatron parameter."""
    if kind == "replicated":
        return hf[0]
    if kind == "split0":
        return hf[0].chunk(size, dim=0)[rank]
    if kind == "split1":
        return hf[0].chunk(size, dim=1)[rank]
    if kind == "vocab":
        full = hf[0]
        padded_rows = -(-full.shape[0] // size) * size
        if padded_rows != full.shape[0]:
            pad = full.new_zeros(padded_rows - full.shape[0], *full.shape[1:])
            full = torch.cat([full, pad], dim=0)
        return full.chunk(size, dim=0)[rank]
    if kind == "qkv":
        return _qkv_fuse(*hf, dims).chunk(size, dim=0)[rank]
    if kind == "gate_up":
        gate, up = (t.chunk(size, dim=0)[rank] for t in hf)
        return torch.cat([gate, up], dim=0)
    if kind == "gate_up_interleaved":
        return to_shard("gate_up", _deinterleave(hf[0]), rank, size, dims)
    if kind == "split1_transposed":
        return hf[0].chunk(size, dim=0)[rank].t()
    if kind == "qkv_gated":
        return _gated_qkv_fuse(*hf, dims).chunk(size, dim=0)[rank]
    if kind == "gdn_in_proj":
        return _per_rank_cat([*torch.split(hf[0], _gdn_sections(dims)), *hf[1:]], rank, size)
    if kind == "gdn_in_proj_grouped":
        return _per_rank_cat(_gdn_ungroup(*hf, dims), rank, size)
    if kind == "gdn_conv":
        return _per_rank_cat(list(torch.split(hf[0], _gdn_sections(dims))), rank, size)
    if kind in ("mamba_in_proj", "mamba_conv"):
        return _per_rank_cat(list(torch.split(hf[0], _mamba_sections(kind, dims))), rank, size)
    raise ValueError(f"unknown layout kind {kind!r}; known: {KINDS}")


def from_shards(kind: str, shards: list[torch.Tensor], dims: Dims) -> list[torch.Tensor]:
    """Every TP rank's shard (rank order) -> the full HF tensor(s)."""
    if kind == "replicated":
        return [shards[0]]
    if kind == "split0":
        return [torch.cat(shards, dim=0)]
    if kind == "split1":
        return [torch.cat(shards, dim=1)]
    if kind == "vocab":
        return [torch.cat(shards, dim=0)[: dims.vocab_size].contiguous()]
    if kind == "qkv":
        return _qkv_split(torch.cat(shards, dim=0), dims)
    if kind == "gate_up":
        halves = [s.chunk(2, dim=0) for s in shards]
        return [torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])]
    if kind == "gate_up_interleaved":
        return [_interleave(*from_shards("gate_up", shards, dims))]
    if kind == "split1_transposed":
        return [torch.cat(shards, dim=1).t().contiguous()]
    if kind == "qkv_gated":
        return _gated_qkv_split(torch.cat(shards, dim=0), dims)
    if kind in ("gdn_in_proj", "gdn_in_proj_grouped"):
        heads = dims.gdn_value_heads
        q, k, v, z, b, a = _per_rank_split(shards, [*_gdn_sections(dims), dims.gdn_value_dim, heads, heads])
        return [torch.cat([q, k, v]), z, b, a] if kind == "gdn_in_proj" else _gdn_group(q, k, v, z, b, a, dims)
    if kind == "gdn_conv":
        return [torch.cat(_per_rank_split(shards, _gdn_sections(dims)))]
    if kind in ("mamba_in_proj", "mamba_conv"):
        return [torch.cat(_per_rank_split(shards, _mamba_sections(kind, dims)))]
    raise ValueError(f"unknown layout kind {kind!r}; known: {KINDS}")


def views_of_unsharded(kind: str, param: torch.Tensor, dims: Dims) -> list[torch.Tensor]:
    """The HF tensor(s) of a TP=1 megatron parameter as views of it (no copy), for a consumer
    that copies them into HF-layout memory (``dest.view(v.shape).copy_(v)``). A view holds its
    HF tensor's elements in row-major order; qkv views are ``[groups, rows per group, *rest]``
    (megatron interleaves q, k, v per query group, so merging those dims would need a copy)."""
    if kind in ("replicated", "split0", "split1", "mamba_in_proj", "mamba_conv"):  # Mamba's: HF's rows at TP=1
        return [param]
    if kind == "vocab":
        return [param[: dims.vocab_size]]
    if kind == "gate_up":
        return list(param.chunk(2, dim=0))
    if kind == "qkv":
        groups, hd = dims.num_query_groups, dims.head_dim
        per_group = dims.num_heads // groups
        grouped = param.view(groups, (per_group + 2) * hd, *param.shape[1:])
        return list(torch.split(grouped, [per_group * hd, hd, hd], dim=1))
    raise ValueError(f"unknown layout kind {kind!r}; known: {KINDS}")


def is_split(kind: str) -> bool:
    """Whether the megatron parameter differs across TP ranks (needs a gather on export)."""
    return kind != "replicated"
