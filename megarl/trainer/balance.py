"""``trainer.balance_batch``: reorder rows so every DP rank gets a similar token count."""

from __future__ import annotations

import heapq
from typing import Sequence


def balanced_partitions(lengths: Sequence[int], parts: int) -> list[list[int]]:
    """Split row indices into ``parts`` groups of equal size (len divisible by parts) with
    near-equal length sums: longest first, each to the lightest group that still has room."""
    n = len(lengths)
    if n % parts:
        raise ValueError(f"balance_batch: {n} rows do not split evenly over {parts} ranks")
    size = n // parts
    heap = [(0, p) for p in range(parts)]
    groups: list[list[int]] = [[] for _ in range(parts)]
    for i in sorted(range(n), key=lambda i: (-lengths[i], i)):
        full = []
        while True:
            load, p = heapq.heappop(heap)
            if len(groups[p]) < size:
                break
            full.append((load, p))
        groups[p].append(i)
        heapq.heappush(heap, (load + lengths[i], p))
        for item in full:
            heapq.heappush(heap, item)
    return [sorted(g) for g in groups]


def balance_order(lengths: Sequence[int], parts: int) -> list[int]:
    """A permutation: the rows of partition 0, then 1, ... (so ``chunk(parts)`` gives the partitions)."""
    return [i for group in balanced_partitions(lengths, parts) for i in group]
