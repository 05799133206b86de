"""Per-bucket checksums: cheap, exact, position-sensitive.

A bucket's bytes are read as little-endian int32 words ``x_i`` (buckets are 16-byte
aligned and zero-padded; a tensor's last 1-3 bytes form a zero-extended word). The
checksum is the pair ``(sum_i x_i, sum_i x_i * (i mod 251 + 1))`` in int64, modulo
2**64: integer sums are exact and order-independent, so the sender (summing tensor
by tensor at their bucket offsets) and the receiver (summing the packed buffer) agree
bit for bit on CPU and GPU, and a flipped, dropped or misplaced word changes it.
On CUDA both sums come from one Triton kernel that reads each word once (int64
accumulation in registers, one int64 atomic add per block and sum; no temporaries,
no host sync), about a copy's cost. Elsewhere (CPU, or no Triton) a torch fallback
widens chunks to int64: one widening, one multiply and two sums per 4 bytes.
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


_TRITON_KERNEL: list = []  # [kernel or None], resolved on first CUDA use
_TRITON_BLOCK = 8192


def _triton_kernel():
    """The Triton checksum kernel, or None when Triton is not importable."""
    if not _TRITON_KERNEL:
        try:
            import triton
            import triton.language as tl
        except Exception:  # noqa: BLE001 - any import failure means: use the fallback
            _TRITON_KERNEL.append(None)
            return None

        @triton.jit(do_not_specialize=["n", "first"])
        def _checksum_kernel(words_ptr, out_ptr, n, first, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # int32: n < 2**31
            mask = offs < n
            x = tl.load(words_ptr + offs, mask=mask, other=0).to(tl.int64)
            w = ((offs + first) % 251 + 1).to(tl.int64)
            tl.atomic_add(out_ptr, tl.sum(x, axis=0))
            tl.atomic_add(out_ptr + 1, tl.sum(x * w, axis=0))

        _TRITON_KERNEL.append(_checksum_kernel)
    return _TRITON_KERNEL[0]


def _words_sums_cuda(words: torch.Tensor, first: int, total: torch.Tensor) -> bool:
    """Add both sums of int32 ``words`` (weights from word index ``first``) into
    ``total`` with the Triton kernel; False when it is not available."""
    kernel = _triton_kernel()
    if kernel is None:
        return False
    n = words.numel()
    for start in range(0, n, 1 << 30):  # keep in-kernel int32 offsets far from overflow
        part = words[start : start + (1 << 30)]
        grid = (-(-part.numel() // _TRITON_BLOCK),)
        kernel[grid](part, total, part.numel(), (first + start) % _MODULUS, BLOCK=_TRITON_BLOCK)
    return True


def words_checksum(data: torch.Tensor, byte_offset: int = 0, *, use_triton: bool = True) -> torch.Tensor:
    """Checksum of a tensor's bytes placed at ``byte_offset`` (a multiple of 4) of a bucket.

    Returns an int64 tensor ``[2]`` on ``data``'s device. ``use_triton=False`` forces
    the torch implementation (same value; for tests and benchmarks).
    """
    if byte_offset % 4:
        raise ValueError(f"words_checksum: byte_offset {byte_offset} is not a multiple of 4")
    raw = data.contiguous().reshape(-1).view(torch.uint8)
    full_words = raw.numel() // 4
    words = raw[: full_words * 4].view(torch.int32)
    first = byte_offset // 4
    total = torch.zeros(2, dtype=torch.int64, device=raw.device)
    fast = use_triton and raw.is_cuda and full_words > 0 and _words_sums_cuda(words, first, total)
    weights = None if fast else _weights(raw.device)
    for start in range(0, 0 if fast else full_words, _CHUNK_WORDS):
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
