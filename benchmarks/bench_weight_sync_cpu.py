"""Weight-sync transport throughput and extra memory vs bucket size (CPU).

Streams a synthetic Qwen2-shaped HF state dict (default: 12 layers, hidden 1024,
~0.6 GB fp32) through the in-process transport, and through the broadcast transport
(2 gloo processes), into a sink that copies every tensor into a preallocated
destination (what vLLM's weight loaders do). Prints, per bucket size: payload bytes,
seconds, GB/s and the peak bytes of live transport buffers.

    .venv/bin/python benchmarks/bench_weight_sync_cpu.py [--layers 12 --hidden 1024]
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.multiprocessing as mp


def qwen2_like(layers: int, hidden: int, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    heads_dim, kv = hidden, hidden // 4
    inter = hidden * 11 // 4
    shapes = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes += [
            (p + "input_layernorm.weight", (hidden,)),
            (p + "self_attn.q_proj.weight", (heads_dim, hidden)), (p + "self_attn.q_proj.bias", (heads_dim,)),
            (p + "self_attn.k_proj.weight", (kv, hidden)), (p + "self_attn.k_proj.bias", (kv,)),
            (p + "self_attn.v_proj.weight", (kv, hidden)), (p + "self_attn.v_proj.bias", (kv,)),
            (p + "self_attn.o_proj.weight", (hidden, heads_dim)),
            (p + "post_attention_layernorm.weight", (hidden,)),
            (p + "mlp.gate_proj.weight", (inter, hidden)), (p + "mlp.up_proj.weight", (inter, hidden)),
            (p + "mlp.down_proj.weight", (hidden, inter)),
        ]
    return shapes + [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]


def _run(kind: str, shapes, bucket_mb: float, integrity: bool, rank: int = 0) -> dict:
    from megarl.weight_sync import SyncStats, build_plan, stream_broadcast, stream_in_process

    torch.manual_seed(0)
    source = {n: torch.randn(s) for n, s in shapes}
    sink = {n: torch.empty(s) for n, s in shapes}
    plan = build_plan([(n, s, torch.float32) for n, s in shapes], bucket_size_bytes=int(bucket_mb * 2**20))
    stats = SyncStats()
    start = time.perf_counter()
    if kind == "in_process":
        stream = stream_in_process(iter(source.items()), plan, integrity_check=integrity, stats=stats)
    else:
        stream = stream_broadcast(iter(source.items()) if rank == 0 else None, plan, src=0,
                                  integrity_check=integrity, stats=stats)
    for name, tensor in stream:
        sink[name].copy_(tensor)
        del tensor
    seconds = time.perf_counter() - start
    return {"bytes": stats.bytes, "seconds": seconds, "gbps": stats.bytes / seconds / 1e9,
            "peak": stats.peak_extra_bytes, "buckets": stats.buckets, "max_bucket": plan.max_bucket_bytes}


def _broadcast_rank(rank, port, shapes, bucket_mb, integrity, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo")
    result = _run("broadcast", shapes, bucket_mb, integrity, rank)
    torch.distributed.destroy_process_group()
    queue.put((rank, result))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--bucket-mb", type=float, nargs="+", default=[4, 16, 64, 256])
    parser.add_argument("--no-integrity", action="store_true", help="also time integrity_check=false")
    args = parser.parse_args()
    torch.set_num_threads(1)
    shapes = qwen2_like(args.layers, args.hidden, args.vocab)
    total = sum(torch.Size(s).numel() * 4 for _, s in shapes)
    print(f"model: {len(shapes)} tensors, {total / 2**20:.0f} MiB fp32; largest tensor "
          f"{max(torch.Size(s).numel() * 4 for _, s in shapes) / 2**20:.0f} MiB")
    print(f"{'transport':<11} {'check':<5} {'bucket_MiB':>10} {'buckets':>7} {'bytes':>12} {'seconds':>8} "
          f"{'GB/s':>6} {'peak_extra_MiB':>14} {'max_bucket_MiB':>14}")
    checks = [True, False] if args.no_integrity else [True]
    for bucket_mb in args.bucket_mb:
        for check in checks:
            rows = [("in_process", _run("in_process", shapes, bucket_mb, check))]
            ctx = mp.get_context("spawn")
            queue = ctx.Queue()
            port = _free_port()
            procs = [ctx.Process(target=_broadcast_rank, args=(r, port, shapes, bucket_mb, check, queue))
                     for r in range(2)]
            for p in procs:
                p.start()
            results = dict(queue.get(timeout=600) for _ in procs)
            for p in procs:
                p.join(timeout=60)
            rows.append(("broadcast", results[1]))  # the receiver's view
            for kind, r in rows:
                print(f"{kind:<11} {str(check):<5} {bucket_mb:>10g} {r['buckets']:>7} {r['bytes']:>12} "
                      f"{r['seconds']:>8.3f} {r['gbps']:>6.2f} {r['peak'] / 2**20:>14.1f} "
                      f"{r['max_bucket'] / 2**20:>14.1f}")


if __name__ == "__main__":
    main()
