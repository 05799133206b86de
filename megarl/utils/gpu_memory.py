"""GPU memory per phase, as the colocated worker and the weight sync report it (CUDA only; ``{}`` elsewhere).

Two figures per phase: torch's allocator peak since the previous report, and the whole device's
memory in use (every allocator and process), each the largest over the ranks of the process's world
(:func:`max_over_world`): a phase's metrics come back from its output ranks, the last pipeline stage, and
under 1F1B the first stage holds the most activations (pp micro-batches in flight, not one), so one
rank's figure can miss the GPU nearest to running out. vLLM's weights and KV cache are allocated through a
torch memory pool, so torch counts them as allocated even while vLLM sleeps and their memory is
unmapped (a 7B TP=2 update showed a "peak" of 103.8 GiB on an 80 GB H100, 34.1 of it vLLM's
sleeping pool): the peak reported here leaves that pool out, so it is what the trainer's own
tensors needed.
"""

from __future__ import annotations

import sys

import torch

__all__ = ["device_used_gib", "is_out_of_memory", "max_over_world", "oom_report", "phase_memory"]

GIB = 2**30


def device_used_gib() -> float | None:
    """Memory in use on this process's GPU (every allocator and process), GiB; None on CPU."""
    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return (total - free) / GIB


def is_out_of_memory(error: BaseException) -> bool:
    """torch's ``OutOfMemoryError``, or vLLM's sleep-mode allocator failing to map memory at a wake-up:
    vLLM 0.20-0.32 (csrc/cumem_allocator.cpp) raises that as a plain ``RuntimeError("CUDA Error: out of
    memory at .../cumem_allocator.cpp:163")`` (the 8B TP=2 x PP=2 run of 2026-11-28 at its third weight sync)."""
    return type(error).__name__ == "OutOfMemoryError" or (
        isinstance(error, RuntimeError) and "CUDA Error: out of memory" in str(error))


def _vllm_pool_bytes() -> int:
    """Bytes of vLLM's sleep-mode pool (its weights and KV cache, mapped or not); 0 without one."""
    cumem = sys.modules.get("vllm.device_allocator.cumem")
    allocator = getattr(getattr(cumem, "CuMemAllocator", None), "instance", None)
    return allocator.get_current_usage() if allocator is not None else 0


def _vllm_pool_by_tag() -> dict[str, int]:
    """vLLM's sleep-mode pool by tag (``weights``, ``kv_cache``), bytes; {} without one. The handle's
    second field is its size, as ``CuMemAllocator.get_current_usage`` reads it (vLLM 0.20-0.32)."""
    cumem = sys.modules.get("vllm.device_allocator.cumem")
    allocator = getattr(getattr(cumem, "CuMemAllocator", None), "instance", None)
    tags: dict[str, int] = {}
    for data in getattr(allocator, "pointer_to_data", {}).values():
        tags[data.tag] = tags.get(data.tag, 0) + data.handle[1]
    return tags


def oom_report() -> str:
    """One line on this GPU's memory when an allocation failed: the device (every process), this
    process's torch allocator (Megatron's tensors: now, and the peak since the last phase report, which
    the failed phase's freed tensors still show) and vLLM's pool by tag. torch counts vLLM's pool in its
    allocated and reserved figures even while it sleeps unmapped, so both are given without it."""
    if not torch.cuda.is_available():
        return "memory: no CUDA device in this process"
    free, total = torch.cuda.mem_get_info()
    pool = _vllm_pool_by_tag()
    pool_bytes = sum(pool.values())
    vllm = ", ".join(f"{tag} {size / GIB:.1f}" for tag, size in sorted(pool.items())) or "none"
    allocated, peak, reserved = (torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated(),
                                 torch.cuda.memory_reserved())
    return (f"memory (GiB): GPU {(total - free) / GIB:.1f} of {total / GIB:.1f} in use (every process); this process: "
            f"torch allocated {(allocated - pool_bytes) / GIB:.1f} (peak {(peak - pool_bytes) / GIB:.1f} in this phase), "
            f"reserved {(reserved - pool_bytes) / GIB:.1f}, beside vLLM's pool (mapped or asleep: {vllm})")


def max_over_world(values: list[float], device: str) -> list[float]:
    """Each of ``values`` maximised over the ranks of torch.distributed's default group (every rank must
    call it; the values as they are without a group). ``device``: where the default group's backend
    reduces (``cuda`` for NCCL, ``cpu`` for gloo)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return values
    both = torch.tensor(values, dtype=torch.float64, device=device)
    torch.distributed.all_reduce(both, op=torch.distributed.ReduceOp.MAX)
    return both.tolist()


def phase_memory(phase: str) -> dict[str, float]:
    """``memory/{phase}_peak_gib`` (torch's allocator peak since the last call, vLLM's pool left
    out) and ``memory/{phase}_device_used_gib`` (the whole device now), each the largest over the
    world's ranks (a collective: every rank of the phase calls it); resets the peak."""
    used = device_used_gib()
    if used is None:
        return {}
    peak = (torch.cuda.max_memory_allocated() - _vllm_pool_bytes()) / GIB
    torch.cuda.reset_peak_memory_stats()
    peak, used = max_over_world([peak, used], "cuda")
    return {f"memory/{phase}_peak_gib": peak, f"memory/{phase}_device_used_gib": used}
