"""Same-run baselines for the weight sync: a device copy and an NCCL all-gather of one rank's share.

  torchrun --nproc_per_node=2 benchmarks/bench_sync_baselines.py --model /tmp/q7b [--tp 2] [--bucket-mb 2048]

The tensors are this rank's shards of the model's weights at TP=``--tp`` (shapes from its
config.json, as vLLM holds them: fused q/k/v and gate/up rows, row-parallel columns,
vocabulary rows), in the model's dtype.

* ``copy``: one ``copy_`` per tensor between two such sets on the device: what a
  shard-to-shard sync does at best (GB/s counts the bytes written once).
* ``all_gather``: ``all_gather_into_tensor`` over the TP ranks in buckets of ``--bucket-mb``,
  every rank ending with the whole tensors: what a gathered sync moves at best (GB/s counts
  the gathered bytes, as the sync's ``weight_sync/gb_per_s`` counts the full tensors it writes).

Prints one JSON line per baseline (median of ``--iters`` after a warm-up).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist


def shard_numels(config: dict, tp: int) -> list[int]:
    """Element counts of one TP rank's tensors, in vLLM's layout."""
    h, layers, heads = config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]
    kv, ffn, vocab = config["num_key_value_heads"], config["intermediate_size"], config["vocab_size"]
    hd = config.get("head_dim") or h // heads
    qkv = (heads + 2 * kv) * hd // tp
    rows = -(-vocab // 64) * 64 // tp
    per_layer = [qkv * h, qkv, h * heads * hd // tp, 2 * ffn // tp * h, h * ffn // tp, h, h]
    heads_and_tables = [rows * h] * (1 if config.get("tie_word_embeddings") else 2) + [h]
    return heads_and_tables + per_layer * layers


def timed(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--bucket-mb", type=int, default=2048)
    parser.add_argument("--iters", type=int, default=3)
    args = parser.parse_args()
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    config = json.load(open(os.path.join(args.model, "config.json")))
    numels = shard_numels(config, args.tp)
    dtype = torch.bfloat16
    src = [torch.randn(n, dtype=dtype, device="cuda") for n in numels]
    dst = [torch.empty_like(t) for t in src]
    nbytes = sum(t.numel() * t.element_size() for t in src)

    def copy():
        for d, s in zip(dst, src):
            d.copy_(s)

    copy()
    copy_s = statistics.median(timed(copy) for _ in range(args.iters))
    dst.clear()
    world = dist.get_world_size()
    flat = torch.cat([t.view(-1) for t in src])
    src.clear()
    bucket = args.bucket_mb * 2**20 // flat.element_size()
    out = torch.empty(bucket * world, dtype=dtype, device="cuda")

    def gather():
        for start in range(0, flat.numel(), bucket):
            piece = flat[start : start + bucket]
            dist.all_gather_into_tensor(out[: piece.numel() * world], piece)

    gather()
    gather_s = statistics.median(timed(gather) for _ in range(args.iters))
    if rank == 0:
        print(json.dumps({"baseline": "copy", "bytes": nbytes, "seconds": round(copy_s, 4),
                          "gb_per_s": round(nbytes / copy_s / 1e9, 1), "device": torch.cuda.get_device_name()}))
        print(json.dumps({"baseline": "all_gather", "ranks": world, "bucket_mb": args.bucket_mb,
                          "gathered_bytes": nbytes * world, "seconds": round(gather_s, 4),
                          "gb_per_s": round(nbytes * world / gather_s / 1e9, 1)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
