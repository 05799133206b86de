"""Page-locked host memory of exactly the size asked for.

torch's pinned allocator (``pin_memory()``, ``pin_memory=True``) rounds every block up to a power of
two, which nearly doubles per-tensor optimizer state (a 136 MB shard takes 256 MB): a 7B actor at TP=2
with everything offloaded asked 243 of a node's 251 GB that way (benchmarks/RESULTS.md, 2026-11-26).
Used by megarl's offload buffers (megarl.workers.megatron.offload) and megatron's CPU optimizer's
host gradients (:mod:`megarl.compat.megatron_core.hybrid_optimizer`).
"""

from __future__ import annotations

import weakref

import torch

__all__ = ["exact_pinned"]


def exact_pinned(nbytes: int) -> torch.UntypedStorage:
    """``nbytes`` of page-locked host memory, exactly: plain host memory registered with CUDA is
    pinned as is; it is unregistered when the storage is freed."""
    storage = torch.empty(nbytes, dtype=torch.uint8).untyped_storage()
    if nbytes:
        cudart = torch.cuda.cudart()
        code = cudart.cudaHostRegister(storage.data_ptr(), nbytes, 0)
        if int(code) != 0:
            raise RuntimeError(f"cudaHostRegister of {nbytes} bytes of host memory failed with CUDA error {int(code)}")
        weakref.finalize(storage, cudart.cudaHostUnregister, storage.data_ptr())
    return storage
