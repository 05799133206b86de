"""Token-budget micro-batching (`use_dynamic_bsz`): balanced, deterministic partitions.

Sequences are grouped into as few micro-batches as the budget allows
(`*_max_token_len_per_gpu`), balanced by token count (longest-first greedy onto the
lightest micro-batch), so a batch of short responses runs in one pass and a batch of long
ones in several. Outputs computed per micro-batch are put back in the caller's row order
with `restore_order`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

import torch

__all__ = ["partition_by_token_budget", "restore_order", "fixed_size_partitions"]


def _greedy_balanced(seq_lens: Sequence[int], num_parts: int) -> list[list[int]]:
    """Longest-first onto the lightest part (ties: lower part index); deterministic."""
    order = sorted(range(len(seq_lens)), key=lambda i: (-seq_lens[i], i))
    heap = [(0, part) for part in range(num_parts)]
    parts: list[list[int]] = [[] for _ in range(num_parts)]
    for index in order:
        load, part = heapq.heappop(heap)
        parts[part].append(index)
        heapq.heappush(heap, (load + seq_lens[index], part))
    return parts


def partition_by_token_budget(
    seq_lens: Sequence[int],
    max_token_len: int,
    *,
    min_num_micro_batches: int = 1,
    key: str = "ppo_max_token_len_per_gpu",
) -> list[list[int]]:
    """Split sequences into micro-batches whose token sums stay within `max_token_len`.

    Args:
        seq_lens: valid tokens of each sequence (prompt + response, padding excluded).
        max_token_len: token budget per micro-batch.
        min_num_micro_batches: at least this many micro-batches (e.g. the pipeline size
            for the interleaved schedule); capped at the number of sequences.
        key: config key named in errors.

    Returns:
        Row indices per micro-batch, each list ascending, micro-batches ordered by their
        first index; every row appears exactly once. Same input -> same output.

    Raises:
        ValueError: a single sequence is longer than the budget.
    """
    seq_lens = [int(n) for n in seq_lens]
    if not seq_lens:
        return []
    if max_token_len <= 0:
        raise ValueError(f"{key} must be > 0, got {max_token_len}")
    longest = max(seq_lens)
    if longest > max_token_len:
        raise ValueError(
            f"{key}={max_token_len} is smaller than a single sequence ({longest} tokens, row "
            f"{seq_lens.index(longest)}); raise it to at least max_prompt_length + max_response_length"
        )
    num_parts = max(math.ceil(sum(seq_lens) / max_token_len), min(min_num_micro_batches, len(seq_lens)), 1)
    while True:
        parts = _greedy_balanced(seq_lens, num_parts)
        if all(sum(seq_lens[i] for i in part) <= max_token_len for part in parts):
            break
        num_parts += 1  # terminates: one sequence per part always fits
    parts = [sorted(part) for part in parts if part]
    return sorted(parts, key=lambda part: part[0])


def fixed_size_partitions(num_rows: int, micro_batch_size: int, key: str) -> list[list[int]]:
    """Consecutive micro-batches of `micro_batch_size` rows (the last may be smaller)."""
    if micro_batch_size is None or micro_batch_size <= 0:
        raise ValueError(f"{key} must be a positive integer, got {micro_batch_size!r}")
    return [list(range(s, min(s + micro_batch_size, num_rows))) for s in range(0, num_rows, micro_batch_size)]


def restore_order(outputs: Sequence[torch.Tensor], partitions: Sequence[Sequence[int]]) -> torch.Tensor:
    """Concatenate per-micro-batch outputs `[len(part), ...]` back into row order `[B, ...]`."""
    flat = [i for part in partitions for i in part]
    stacked = torch.cat(list(outputs), dim=0)
    if stacked.shape[0] != len(flat):
        raise ValueError(f"outputs have {stacked.shape[0]} rows, partitions {len(flat)}")
    inverse = torch.empty(len(flat), dtype=torch.long)
    inverse[torch.tensor(flat, dtype=torch.long)] = torch.arange(len(flat))
    return stacked[inverse]
