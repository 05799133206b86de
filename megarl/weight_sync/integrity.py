"""Per-bucket checksums: cheap, exact, position-sensitive.

A bucket's bytes are read as int16 words ``x_i`` (buckets are 16-byte aligned and
zero-padded). The checksum is the pair ``(sum_i x_i, sum_i x_i * (i mod 251 + 1))``
in int64: integer sums are exact and order-independent, so the sender (summing
tensor by tensor at their bucket offsets) and the receiver (summing the packed
buffer) agree bit for bit on CPU and GPU, and a flipped, dropped or misplaced word
changes the result. Overflow is impossible below 2**52 / (2**15 * 251) words (> 256 GB).
"""

from __future__ import annotations

from typing import Sequence

import torch

_MODULUS = 251
_CHUNK_WORDS = 1 << 22  # bounds the int64 temporaries to 64 MiB


class WeightSyncIntegrityError(RuntimeError):
    """A bucket's checksum on the receiver differs from the sender's."""

    def __init__(self, bucket_index: int, names: Sequence[str], expected, got) -> None:
        shown = ", ".join(list(names)[:8]) + (" ..." if len(names) > 8 else "")
        super().__init__(
            f"weight sync integrity check failed for bucket {bucket_index} "
            f"({len(names)} parameters: {shown}): sender checksum {tuple(expected)}, "
            f"receiver checksum {tuple(got)}. The rollout engine did NOT get these "
            "weights; set actor_rollout_ref.rollout.weight_sync.integrity_check=false "
            "only to debug."
        )
        self.bucket_index = bucket_index
        self.names = list(names)


def words_checksum(data: torch.Tensor, first_word: int = 0) -> torch.Tensor:
    """Checksum of a contiguous tensor's bytes placed at int16 word ``first_word``.

    Returns an int64 tensor ``[2]`` on ``data``'s device. Byte count must be even.
    """
    words = data.contiguous().reshape(-1).view(torch.uint8).view(torch.int16)
    total = torch.zeros(2, dtype=torch.int64, device=data.device)
    for start in range(0, words.numel(), _CHUNK_WORDS):
        chunk = words[start : start + _CHUNK_WORDS].to(torch.int64)
        weight = torch.arange(
            first_word + start, first_word + start + chunk.numel(), device=data.device
        ).remainder_(_MODULUS).add_(1)
        total[0] += chunk.sum()
        total[1] += (chunk * weight).sum()
    return total


def checksum_pair(checksum: torch.Tensor) -> tuple[int, int]:
    return int(checksum[0]), int(checksum[1])
