"""Long context (issue 31 item 7): megarl's actor at 16k-32k tokens with context parallelism and with
TP + sequence parallelism, against the same model and tokens at CP=1 / SP off.

One layout per torchrun (Megatron's parallel state is set once a process); each run writes rank 0's
log-probs and its timings, then ``--compare`` checks every layout against the first:

  torchrun --nproc_per_node=2 benchmarks/bench_long_context.py --tp 2 --out /tmp/lc/tp2          # reference
  torchrun --nproc_per_node=2 benchmarks/bench_long_context.py --tp 2 --sp --out /tmp/lc/tp2_sp
  torchrun --nproc_per_node=2 benchmarks/bench_long_context.py --tp 1 --cp 2 --out /tmp/lc/cp2
  python benchmarks/bench_long_context.py --compare /tmp/lc/tp2 /tmp/lc/tp2_sp /tmp/lc/cp2
  torchrun --nproc_per_node=2 benchmarks/bench_long_context.py --tiny --tp 2 --out /tmp/lc/t   # CPU dry run

The actor is `ActorWorker` as `main_ppo` builds it (verl's keys, packed sequences, the
transformer-engine spec on CUDA): ``--batch`` random sequences of ``--seq`` tokens (the last 3/4 the
response), the same on every run (seeded); log-probs of the response tokens (``compute_log_prob``, one
micro-batch per sequence) and one PPO update over them (``update_policy``, ``--optimizer sgd`` keeps a 7B
update within one 80 GiB card's memory). Prints and writes ``<out>.json``: seconds and tokens/s per GPU of
each pass, peak memory; ``<out>.pt``: the log-probs ``[batch, response]`` (float32).
Equal within bf16 tolerance: a different split of the same sums rounds differently at bf16, so the bound is
the same order as TP=1 vs TP=2 at this length; the printout gives mean and max absolute difference and the
Pearson correlation of the two log-prob vectors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import QWEN2_TINY, QWEN25_1P5B, QWEN25_7B, init_process_group, median, rank0_print, time_it  # noqa: E402


def run_layout(args: argparse.Namespace) -> None:
    from _actor_path import actor_config, full_length_batch, write_random_hf_dir

    from megarl.workers.actor import ActorWorker

    device = init_process_group()
    shape = QWEN2_TINY if args.tiny else {"1.5b": QWEN25_1P5B, "7b": QWEN25_7B}[args.shape]
    seq = 128 if args.tiny else args.seq
    shape = dict(shape, max_position_embeddings=max(shape["max_position_embeddings"], seq))
    model_dir = write_random_hf_dir(shape, os.path.join(os.environ.get("TMPDIR", "/tmp"), f"megarl_lc_{args.shape}_{seq}"
                                                        + ("_tiny" if args.tiny else "")))
    cfg = actor_config(model_dir, args.tp, micro_bs=1, n_micro=args.batch, remove_padding=True,
                       dist_opt=device.type == "cuda" and args.optimizer == "adam",
                       impl="transformer_engine" if device.type == "cuda" else "local",
                       optimizer=args.optimizer, cp=args.cp, sp=args.sp)
    worker = ActorWorker(cfg, role="actor", device=device.type)
    worker.init_model()
    g = torch.Generator().manual_seed(7)
    batches = [torch.randint(0, shape["vocab_size"], (1, seq), generator=g) for _ in range(args.batch)]
    data = full_length_batch(batches, response_len=seq * 3 // 4)
    world = dist.get_world_size()
    tokens = args.batch * seq

    log_probs: list[torch.Tensor] = []

    def forward() -> None:
        log_probs[:] = [worker.compute_log_prob(data).batch["old_log_probs"].float().cpu()]

    fwd = time_it(forward, device, warmup=1, iters=args.iters)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    upd = time_it(lambda: worker.update_policy(data), device, warmup=1, iters=args.iters)
    result = dict(
        layout=dict(tp=args.tp, cp=args.cp, sp=args.sp, world=world), shape=args.shape if not args.tiny else "tiny",
        seq=seq, batch=args.batch, optimizer=args.optimizer,
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        log_prob_s=median(fwd), log_prob_tokens_per_s_per_gpu=tokens / median(fwd) / world,
        update_s=median(upd), update_tokens_per_s_per_gpu=tokens / median(upd) / world,
        update_peak_gib=torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
    )
    rank0_print(json.dumps(result))
    if dist.get_rank() == 0:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        torch.save(log_probs[0], args.out + ".pt")
        with open(args.out + ".json", "w") as f:
            json.dump(result, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


def compare(paths: list[str]) -> None:
    """Every layout's log-probs against the first's."""
    reference = torch.load(paths[0] + ".pt")
    for path in paths:
        timing = json.load(open(path + ".json"))
        other = torch.load(path + ".pt")
        diff = (other - reference).abs()
        corr = torch.corrcoef(torch.stack([other.flatten(), reference.flatten()]))[0, 1].item()
        print(f"{os.path.basename(path):>12}  {timing['layout']}  log-prob {timing['log_prob_s']:.2f} s "
              f"({timing['log_prob_tokens_per_s_per_gpu']:.0f} tok/s/GPU), update {timing['update_s']:.2f} s "
              f"({timing['update_tokens_per_s_per_gpu']:.0f} tok/s/GPU, peak {timing['update_peak_gib'] or 0:.1f} GiB); "
              f"vs {os.path.basename(paths[0])}: mean |d| {diff.mean():.4f}, max |d| {diff.max():.4f}, corr {corr:.5f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--cp", type=int, default=1)
    p.add_argument("--sp", action="store_true", help="sequence parallelism (needs --tp > 1)")
    p.add_argument("--seq", type=int, default=16384)
    p.add_argument("--batch", type=int, default=2, help="sequences (one micro-batch each)")
    p.add_argument("--shape", default="1.5b", choices=["1.5b", "7b"])
    p.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    p.add_argument("--iters", type=int, default=2)
    p.add_argument("--tiny", action="store_true", help="tiny model, 128 tokens (CPU dry run)")
    p.add_argument("--out", default="/tmp/long_context/run")
    p.add_argument("--compare", nargs="+", metavar="OUT", help="compare the runs written to these --out paths")
    args = p.parse_args()
    if args.compare:
        compare(args.compare)
    else:
        run_layout(args)


if __name__ == "__main__":
    main()
