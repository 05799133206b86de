"""Context parallelism's sequence split: megatron's load-balanced chunks, and the gather back.

With CP size ``c`` a sequence of ``n`` tokens (``n`` a multiple of ``2c``) is cut into ``2c``
equal chunks; CP rank ``r`` holds chunks ``r`` and ``2c-1-r``, in that order. Causal attention
costs more for later chunks, so every rank gets the same work. This is
``megatron.core.utils.get_batch_on_this_cp_rank`` for padded rows and transformer-engine's
``thd_get_partitioned_indices`` for packed sequences (each sequence split on its own), and
what megatron's RoPE (``get_pos_emb_on_this_cp_rank``, ``_get_thd_freqs_on_this_cp_rank``)
assumes. The CP sizes themselves are :class:`megarl.parallel.layout.ParallelLayout`'s ``cp``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

__all__ = ["cp_token_index", "gather_tokens_from_cp"]


def cp_token_index(seq_lens: Sequence[int], cp_size: int) -> torch.Tensor:
    """Which tokens each CP rank holds, for sequences laid back to back along one token axis.

    Args:
        seq_lens: lengths of the sequences, in order (each a multiple of ``2 * cp_size``).
        cp_size: context-parallel size ``c``.

    Returns:
        ``[c, sum(seq_lens) / c]`` int64: row ``r`` lists, in rank ``r``'s local order, the
        positions on the full axis of its tokens (per sequence: chunk ``r``, then chunk
        ``2c-1-r``).

    Raises:
        ValueError: a length is not a multiple of ``2 * cp_size``.
    """
    chunks = 2 * cp_size
    lens = torch.as_tensor([int(n) for n in seq_lens], dtype=torch.long)
    uneven = lens % chunks != 0
    if uneven.any():
        raise ValueError(
            f"context parallelism: a sequence of {int(lens[uneven][0])} tokens does not split into 2 x cp = {chunks} chunks"
        )
    size = lens // chunks  # [S] tokens per chunk
    starts = lens.cumsum(0) - lens
    sizes = size.repeat_interleave(2)  # [2S]: a rank's two chunks of each sequence
    within = torch.arange(int(sizes.sum())) - (sizes.cumsum(0) - sizes).repeat_interleave(sizes)  # offset in its chunk
    rows = []
    for rank in range(cp_size):
        chunk = torch.tensor([rank, chunks - 1 - rank])
        first = (starts[:, None] + chunk[None] * size[:, None]).flatten()  # [2S] first position of each chunk
        rows.append(first.repeat_interleave(sizes) + within)
    return torch.stack(rows)


class _GatherTokens(torch.autograd.Function):
    """All-gather along dim 1 into full-axis order; backward: this rank's slice of the gradient.

    The slice (no reduction) is the gradient only because every CP rank computes the same
    function of the gathered tensor (the loss on the whole sequence): each rank then
    back-propagates exactly the part that flows through its own tokens.
    """

    @staticmethod
    def forward(ctx, local: torch.Tensor, index: torch.Tensor, group) -> torch.Tensor:
        parts = [torch.empty_like(local) for _ in range(group.size())]
        dist.all_gather(parts, local.contiguous(), group=group)
        full = local.new_empty((local.shape[0], index.numel(), *local.shape[2:]))
        full[:, index.flatten().to(local.device)] = torch.cat(parts, dim=1)
        ctx.save_for_backward(index[group.rank()].to(local.device))
        return full

    @staticmethod
    def backward(ctx, grad_full: torch.Tensor):
        (mine,) = ctx.saved_tensors
        return grad_full[:, mine], None, None


def gather_tokens_from_cp(local: torch.Tensor, index: torch.Tensor, group) -> torch.Tensor:
    """Per-token values of this CP rank ``[b, n / c, ...]`` -> the whole axis ``[b, n, ...]``,
    identical on every CP rank (``index``: :func:`cp_token_index`'s ``[c, n / c]``). Differentiable
    (see :class:`_GatherTokens`: the caller's loss must be the same on every CP rank)."""
    if group.size() == 1:
        return local
    return _GatherTokens.apply(local, index, group)
