"""Per-bucket checksums: cheap, exact, position-sensitive.

A bucket's bytes are read as little-endian int32 words ``x_i`` (buckets are 16-byte
aligned and zero-padded; a tensor's last 1-3 bytes form a zero-extended word). The
checksum is the pair ``(sum_i x_i, sum_i x_i * (i mod 251 + 1))`` in int64, modulo
2**64: integer sums are exact and order-independent, so the sender (summing tensor
by tensor at their bucket offsets) and the receiver (summing the packed buffer) agree
bit for bit on CPU and GPU, and a flipped, dropped or misplaced word changes it.
Cost: one int64 widening, one multiply and two sums per 4 bytes.
"""

from __future__ import annotations

from typing import Sequence

import torch

_MODULUS = 251
_CHUNK_WORDS = 1 << 22  # bounds the int64 temporaries to 32 MiB
_WEIGHTS: dict[torch.device, torch.Tensor] = {}


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


def _weights(device: torch.device) -> torch.Tensor:
    """``(j mod 251) + 1`` for ``j < CHUNK + 251``: slicing at ``s mod 251`` gives the
    weights of words ``s, s+1, ...``."""
    if device not in _WEIGHTS:
        _WEIGHTS[device] = torch.arange(_CHUNK_WORDS + _MODULUS, device=device).remainder_(_MODULUS).add_(1)
    return _WEIGHTS[device]


def words_checksum(data: torch.Tensor, byte_offset: int = 0) -> torch.Tensor:
    """Checksum of a tensor's bytes placed at ``byte_offset`` (a multiple of 4) of a bucket.

    Returns an int64 tensor ``[2]`` on ``data``'s device.
    """
    if byte_offset % 4:
        raise ValueError(f"words_checksum: byte_offset {byte_offset} is not a multiple of 4")
    raw = data.contiguous().reshape(-1).view(torch.uint8)
    full_words = raw.numel() // 4
    words = raw[: full_words * 4].view(torch.int32)
    weights = _weights(raw.device)
    first = byte_offset // 4
    total = torch.zeros(2, dtype=torch.int64, device=raw.device)
    for start in range(0, full_words, _CHUNK_WORDS):
        chunk = words[start : start + _CHUNK_WORDS].to(torch.int64)
        shift = (first + start) % _MODULUS
        total[0] += chunk.sum()
        total[1] += (chunk * weights[shift : shift + chunk.numel()]).sum()
    tail = raw[full_words * 4 :]
    if tail.numel():
        value = sum(int(b) << (8 * i) for i, b in enumerate(tail.tolist()))
        total[0] += value
        total[1] += value * ((first + full_words) % _MODULUS + 1)
    return total


def checksum_pair(checksum: torch.Tensor) -> tuple[int, int]:
    return int(checksum[0]), int(checksum[1])
