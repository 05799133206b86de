"""Weight sync on GPUs: Megatron TP=2 shards -> full HF/vLLM-layout buffers, through megarl.

A Qwen2.5-1.5B-shaped model (random bf16 weights) is built with megarl.models at TP=2
on 2 GPUs. Every variant ends by copying each delivered tensor into preallocated
"engine" buffers, as vLLM's weight loaders do:

  * rollout TP=1: the full HF tensor on each GPU;
  * rollout TP=2: this GPU's vLLM shard (rows of column-parallel tensors, columns of
    o_proj/down_proj, whole norms), sliced from the delivered full tensor.

Variants (all collective over the 2 GPUs, timed with a device synchronize):
  export_per_tensor      megarl.models.export_hf_weights (one all_gather per tensor)
  v1_bucketed_<MiB>      the previous bucketed export (benchmarks/_weight_sync_v1.py):
                         cat-packed shards, one all_gather per bucket, per-tensor copies
  gather_<MiB>           weight_sync.tp_gather.export_hf_weights_bucketed: grouped
                         all_gathers in HF layout into one reused ring buffer of <MiB>
  gather_<MiB>_dest      the same, tensors larger than the ring written in row chunks
                         straight into the engine's buffer (``destinations``)
  gather_stream          stream_in_process over gather_ (what the hybrid worker runs),
                         with and without integrity checksums
  stream_broadcast       weight_sync.stream_broadcast: GPU 0 holds the full model and
                         sends it to GPU 1 (non-colocated rollout)
Bitwise checks: before each, the engine buffers are filled with NaN.
Checksum alone: words_checksum over 1 GiB, Triton kernel vs the torch fallback.
References in the same run: one all_gather_into_tensor of the whole model (output GB/s),
the same in bucket-sized pieces, and a 1 GiB broadcast.

GB/s = full-model bytes delivered per GPU / seconds. Peak extra memory =
max_memory_allocated during the variant minus what was allocated before (engine buffers
preallocated, so not counted).

Run: torchrun --nproc_per_node=2 benchmarks/bench_weight_sync_gpu.py
CPU dry run: torchrun --nproc_per_node=2 benchmarks/bench_weight_sync_gpu.py --tiny
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (  # noqa: E402
    QWEN2_TINY,
    QWEN25_1P5B,
    QWEN25_7B,
    QWEN25_7B_BYTES,
    MemProbe,
    hf_config,
    median,
    rank0_print,
    sync,
    time_it,
    write_json,
)

_ROW_PARALLEL = ("o_proj.weight", "down_proj.weight")


def vllm_tp_slice(name: str, full: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """This rank's slice of a full HF tensor under vLLM tensor parallelism (Qwen2)."""
    if size == 1 or "norm" in name:
        return full
    dim = 1 if name.endswith(_ROW_PARALLEL) else 0
    n = full.shape[dim] // size
    return full.narrow(dim, rank * n, n)


class EngineBuffers:
    """Preallocated destination tensors of one rollout layout, filled by `load`."""

    def __init__(self, shapes: dict[str, tuple[torch.Size, torch.dtype]], rollout_tp: int, device):
        self.rollout_tp = rollout_tp
        self.rank = dist.get_rank() % rollout_tp
        self.tensors = {}
        for name, (shape, dtype) in shapes.items():
            probe = torch.empty(shape, dtype=dtype, device="meta")
            local = vllm_tp_slice(name, probe, self.rank, rollout_tp)
            self.tensors[name] = torch.empty(local.shape, dtype=dtype, device=device)
        self.nbytes = sum(t.numel() * t.element_size() for t in self.tensors.values())

    def load(self, stream) -> int:
        """Consume (name, full tensor) pairs; returns how many were loaded."""
        count = 0
        for name, full in stream:
            self.tensors[name].copy_(vllm_tp_slice(name, full, self.rank, self.rollout_tp))
            count += 1
        if count != len(self.tensors):
            raise RuntimeError(f"engine got {count} tensors, expected {len(self.tensors)}")
        return count


def measure(label, fn, device, warmup, iters, full_bytes, bucket_bytes=None):
    with MemProbe(device) as probe:
        times = time_it(fn, device, warmup, iters)
        extra = probe.peak_extra()
    t = median(times)
    return dict(
        label=label,
        seconds=t,
        seconds_all=times,
        gb_per_s=full_bytes / t / 1e9,
        peak_extra_bytes=extra,
        peak_extra_in_buckets=(extra / bucket_bytes) if bucket_bytes else None,
        seconds_7b_equiv=QWEN25_7B_BYTES / (full_bytes / t),
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--shape", choices=["1.5b", "7b"], default="1.5b")
    p.add_argument("--bucket-mb", type=int, nargs="+", default=[128, 256, 512])
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--out", default="weight_sync_gpu.json")
    args = p.parse_args()

    from megarl.models import build_model, export_hf_weights
    from megarl.parallel import init_distributed
    from megarl.weight_sync import build_plan, stream_broadcast, stream_in_process
    from megarl.weight_sync.tp_gather import export_hf_weights_bucketed

    from _weight_sync_v1 import export_hf_weights_bucketed_v1

    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    layout = init_distributed({"tensor_model_parallel_size": 2, "seed": 7}, device_type)
    device = torch.device("cuda", torch.cuda.current_device()) if device_type == "cuda" else torch.device("cpu")
    dtype = torch.bfloat16
    shape = QWEN2_TINY if args.tiny else {"1.5b": QWEN25_1P5B, "7b": QWEN25_7B}[args.shape]
    hf = hf_config(shape)
    chunks = build_model(hf, {"tensor_model_parallel_size": 2}, device=device, dtype=dtype)
    world_group = dist.group.WORLD
    rank = dist.get_rank()

    # Reference export (also gives the shapes) kept for the bitwise check.
    reference = {name: t.clone() for name, t in export_hf_weights(chunks, hf)}
    shapes = {name: (t.shape, t.dtype) for name, t in reference.items()}
    full_bytes = sum(t.numel() * t.element_size() for t in reference.values())
    engine_tp1 = EngineBuffers(shapes, 1, device)
    engine_tp2 = EngineBuffers(shapes, 2, device)
    rank0_print(f"model: {len(shapes)} HF tensors, {full_bytes / 1e9:.3f} GB bf16; device {device}")

    results = dict(
        device=torch.cuda.get_device_name(device) if device_type == "cuda" else "cpu",
        torch=torch.__version__,
        shape="tiny" if args.tiny else args.shape,
        full_bytes=full_bytes,
        num_tensors=len(shapes),
        bytes_7b_equiv=QWEN25_7B_BYTES,
        runs=[],
        checks={},
    )
    W, I = args.warmup, args.iters

    def run(label, fn, bucket_bytes=None):
        try:
            r = measure(label, fn, device, W, I, full_bytes, bucket_bytes)
        except Exception:
            r = dict(label=label, error=traceback.format_exc())
            rank0_print(f"{label} failed:\n{r['error']}")
        results["runs"].append(r)
        return r

    # --- raw references ------------------------------------------------------------
    tp_group = None
    from megatron.core import parallel_state

    tp_group = parallel_state.get_tensor_model_parallel_group()
    local_bytes = (full_bytes + 1) // 2
    raw_in = torch.empty(local_bytes // 2, dtype=torch.bfloat16, device=device).normal_()
    raw_out = torch.empty(2 * raw_in.numel(), dtype=raw_in.dtype, device=device)
    run("raw_all_gather_whole_model", lambda: dist.all_gather_into_tensor(raw_out, raw_in, group=tp_group))
    for mb in args.bucket_mb:
        n = max(1, (mb * 2**20) // 2 // 2)  # bf16 elements per rank per bucket

        def raw_bucketed(n=n):
            for s in range(0, raw_in.numel(), n):
                piece = raw_in[s : s + n]
                dist.all_gather_into_tensor(raw_out[2 * s : 2 * s + 2 * piece.numel()], piece, group=tp_group)

        run(f"raw_all_gather_{mb}MiB_pieces", raw_bucketed)
    bcast = torch.empty(min(2**30, full_bytes) // 2, dtype=torch.bfloat16, device=device).normal_()
    r = run("raw_broadcast_1GiB", lambda: dist.broadcast(bcast, 0, group=world_group))
    if "seconds" in r:  # this one moves bcast bytes, not the model
        r["gb_per_s"] = bcast.numel() * 2 / r["seconds"] / 1e9
        r["seconds_7b_equiv"] = QWEN25_7B_BYTES / (bcast.numel() * 2 / r["seconds"])
    del raw_in, raw_out, bcast
    if device_type == "cuda":
        torch.cuda.empty_cache()

    # --- megarl paths ----------------------------------------------------------------
    # The plan from the export's own (name, shape, dtype) order: the same buckets
    # plan_for_model makes from a checkpoint directory, without needing one on disk.
    param_meta = [(name, tuple(t.shape), t.dtype) for name, t in reference.items()]
    plans = {
        mb: build_plan(param_meta, layout=layout, rollout_tp=1, bucket_size_bytes=mb * 2**20)
        for mb in args.bucket_mb
    }
    mb0 = 256 if 256 in plans else args.bucket_mb[0]
    b0 = mb0 * 2**20

    def checked(label, engine, fn, expected):
        """Poison the engine buffers (NaN), run `fn` once, compare bitwise."""
        for t in engine.tensors.values():
            t.fill_(float("nan"))
        fn()
        sync(device)
        results["checks"][label] = all(torch.equal(engine.tensors[n], expected(n)) for n in reference)

    full_ref = reference.__getitem__
    tp2_ref = lambda n: vllm_tp_slice(n, reference[n], rank % 2, 2)  # noqa: E731

    def gather_tp1(mb, dest=False):
        return lambda: engine_tp1.load(
            export_hf_weights_bucketed(
                chunks, hf, bucket_size_bytes=mb * 2**20, destinations=engine_tp1.tensors if dest else None
            )
        )

    run("export_per_tensor_tp1", lambda: engine_tp1.load(export_hf_weights(chunks, hf)))
    v1 = lambda: engine_tp1.load(export_hf_weights_bucketed_v1(chunks, hf, bucket_size_bytes=b0))  # noqa: E731
    run(f"v1_bucketed_{mb0}MiB_tp1", v1, b0)
    checked("v1_bucketed_tp1_bitwise", engine_tp1, v1, full_ref)
    for mb in args.bucket_mb:
        run(f"gather_{mb}MiB_tp1", gather_tp1(mb), mb * 2**20)
        run(f"gather_{mb}MiB_tp1_dest", gather_tp1(mb, dest=True), mb * 2**20)
    checked("gather_tp1_bitwise", engine_tp1, gather_tp1(mb0), full_ref)
    checked("gather_tp1_dest_bitwise", engine_tp1, gather_tp1(mb0, dest=True), full_ref)
    small = max(1, min(args.bucket_mb) // 4)
    checked(f"gather_{small}MiB_tp1_dest_bitwise", engine_tp1, gather_tp1(small, dest=True), full_ref)
    g_tp2 = lambda: engine_tp2.load(export_hf_weights_bucketed(chunks, hf, bucket_size_bytes=b0))  # noqa: E731
    run(f"gather_{mb0}MiB_tp2", g_tp2, b0)
    checked("gather_tp2_slices_bitwise", engine_tp2, g_tp2, tp2_ref)
    v1_tp2 = lambda: engine_tp2.load(export_hf_weights_bucketed_v1(chunks, hf, bucket_size_bytes=b0))  # noqa: E731
    run(f"v1_bucketed_{mb0}MiB_tp2", v1_tp2, b0)

    # What the colocated hybrid worker runs: the export through stream_in_process
    # (repack into the plan's buckets; integrity_check = per-bucket checksums).
    for check in (False, True):
        fn = lambda check=check: engine_tp1.load(  # noqa: E731
            stream_in_process(
                export_hf_weights_bucketed(chunks, hf, bucket_size_bytes=b0), plans[mb0], integrity_check=check
            )
        )
        run(f"gather_stream_{mb0}MiB_{'check' if check else 'nocheck'}", fn, 2 * b0)
    checked("gather_stream_check_bitwise", engine_tp1, fn, full_ref)

    # Non-colocated: GPU 0 holds full tensors, broadcasts them to GPU 1.
    source = list(reference.items()) if rank == 0 else None
    for check in (False, True):
        run(
            f"stream_broadcast_{mb0}MiB_{'check' if check else 'nocheck'}",
            lambda check=check: engine_tp1.load(
                stream_broadcast(
                    iter(source) if source is not None else None,
                    plans[mb0],
                    src=0,
                    group=world_group,
                    device=device,
                    integrity_check=check,
                )
            ),
            mb0 * 2**20,
        )
    results["checks"]["broadcast_bitwise_equal"] = all(torch.equal(engine_tp1.tensors[n], reference[n]) for n in reference)

    # Checksum alone: words_checksum over 1 GiB (Triton kernel vs the torch fallback).
    from megarl.weight_sync.integrity import words_checksum

    probe = torch.randint(-(2**31), 2**31 - 1, (min(2**30, full_bytes) // 4,), dtype=torch.int32, device=device)
    results["checks"]["checksum_triton_equals_torch"] = bool(
        torch.equal(words_checksum(probe, 12), words_checksum(probe, 12, use_triton=False))
        and torch.equal(words_checksum(probe[1:], 8).cpu(), words_checksum(probe[1:].cpu(), 8))
    )
    for use_triton in (True, False):
        times = time_it(lambda: words_checksum(probe, use_triton=use_triton), device, 2, 10)
        t = median(times)
        results["checksum"] = results.get("checksum", {})
        results["checksum"]["triton" if use_triton else "torch"] = dict(
            seconds_per_GiB=t * 2**30 / (probe.numel() * 4), gb_per_s=probe.numel() * 4 / t / 1e9
        )
    del probe

    raw = {r["label"]: r for r in results["runs"] if "gb_per_s" in r}
    raw_ag = raw.get("raw_all_gather_whole_model", {}).get("gb_per_s")
    raw_bc = raw.get("raw_broadcast_1GiB", {}).get("gb_per_s")
    for r in results["runs"]:
        if "gb_per_s" not in r:
            continue
        ref = raw_bc if "broadcast" in r["label"] else raw_ag
        r["pct_of_raw"] = 100.0 * r["gb_per_s"] / ref if ref else None
    write_json(args.out, results)

    rank0_print(f"\n# weight sync  model {full_bytes / 1e9:.2f} GB, 7B-equivalent {QWEN25_7B_BYTES / 1e9:.1f} GB")
    rank0_print(f"{'variant':<36} {'s':>7} {'GB/s':>7} {'%raw':>6} {'7B s':>6} {'extra MiB':>10}")
    for r in results["runs"]:
        if "gb_per_s" not in r:
            rank0_print(f"{r['label']:<36} FAILED")
            continue
        rank0_print(
            f"{r['label']:<36} {r['seconds']:7.4f} {r['gb_per_s']:7.1f} {r.get('pct_of_raw') or 0:6.1f} "
            f"{r['seconds_7b_equiv']:6.3f} {r['peak_extra_bytes'] / 2**20:10.1f}"
        )
    rank0_print(f"checks: {results['checks']}")
    rank0_print(f"checksum alone: {results.get('checksum')}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
