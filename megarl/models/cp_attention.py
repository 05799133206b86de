"""Causal attention under context parallelism without transformer-engine (the SDPA spec's).

Each CP rank holds two of the ``2c`` load-balanced chunks of every sequence
(:mod:`megarl.parallel.context_parallel`). Its queries need the keys/values of all earlier
positions, so K and V are all-gathered over the CP group (megatron's
``gather_from_sequence_parallel_region``: the backward reduce-scatters their gradients, so
each rank's K/V receive the gradient of every rank's queries), put back in sequence order,
and each local query attends to the global positions at or before its own.

Where transformer-engine runs, megatron's TE attention does CP itself (``cp_comm_type``);
this is the fallback for CPU and GPUs without TE: simple rather than fast (all of K/V on
every rank, SDPA's masked kernels).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region

from megarl.parallel.context_parallel import cp_token_index

__all__ = ["context_parallel_attention"]


def context_parallel_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    cp_group,
    scale: float,
    dropout_p: float = 0.0,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of this CP rank's queries over the whole sequence(s).

    Args:
        query: ``[sq, b, np, hn]``, this rank's ``sq`` tokens (its two chunks of each sequence).
        key, value: ``[sq, b, ng, hn]``; ``np % ng == 0`` (GQA: ``np / ng`` query heads per KV head).
        cp_group: the context-parallel group (size ``c``).
        scale: softmax scale; dropout_p: attention dropout probability.
        cu_seqlens: packed (thd, ``b == 1``): ``[num_seqs + 1]`` cumulative padded lengths of the
            full sequences (each a multiple of ``2c``), attention stays within a sequence;
            None: every row is one sequence of ``c * sq`` tokens.

    Returns:
        ``[sq, b, np * hn]``.
    """
    cp_size, cp_rank = cp_group.size(), cp_group.rank()
    sq, batch, num_heads, _ = query.shape
    device = query.device
    if cu_seqlens is None:
        seq_lens = [sq * cp_size]
    else:
        seq_lens = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    index = cp_token_index(seq_lens, cp_size).to(device)  # [c, sq]: full-axis position of each rank's tokens
    gathered_row = torch.empty(cp_size * sq, dtype=torch.long, device=device)
    gathered_row[index.flatten()] = torch.arange(cp_size * sq, device=device)
    # [c * sq, b, ng, hn], rank-major -> sequence order
    keys, values = (gather_from_sequence_parallel_region(t, True, group=cp_group)[gathered_row] for t in (key, value))
    q, k, v = (t.permute(1, 2, 0, 3) for t in (query, keys, values))  # [b, n, s, hn]
    gqa = num_heads != key.shape[2]
    q_pos = index[cp_rank]
    if cu_seqlens is not None:
        k_pos = torch.arange(cp_size * sq, device=device)
        bounds = cu_seqlens[1:].to(device)
        same_seq = torch.bucketize(q_pos, bounds, right=True)[:, None] == torch.bucketize(k_pos, bounds, right=True)[None]
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=same_seq & (k_pos[None] <= q_pos[:, None]), dropout_p=dropout_p, scale=scale,
            enable_gqa=gqa,
        )
    else:
        # One row: per local chunk, only the keys up to its end, causal on the last chunk.
        size = sq // 2
        outs = []
        for half in range(2):
            first = int(q_pos[half * size])  # global position of the chunk's first token
            allowed = torch.arange(first + size, device=device)[None] <= (first + torch.arange(size, device=device))[:, None]
            outs.append(F.scaled_dot_product_attention(
                q[:, :, half * size:(half + 1) * size], k[:, :, :first + size], v[:, :, :first + size],
                attn_mask=allowed, dropout_p=dropout_p, scale=scale, enable_gqa=gqa,
            ))
        out = torch.cat(outs, dim=2)
    return out.permute(2, 0, 1, 3).reshape(sq, batch, -1)
