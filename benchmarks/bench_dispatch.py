"""Controller <-> worker transfer of a realistic batch through a WorkerGroup (issue 16 item 7).

  python benchmarks/bench_dispatch.py [--rows 4096 --prompt 512 --response 2048 --iters 3]

Two CPU ranks in one DP group (TP=2, as any TP/PP/CP layout: every rank of the group gets
the same rows), a batch shaped like a training step's (512 prompts x 8 responses, 512 +
2048 tokens: input_ids / attention_mask / position_ids, responses, response_mask,
old_log_probs, advantages), and a worker method returning a ``[B, R]`` float tensor (a
log-prob pass). Times, alternating, median of ``--iters``:

* ``raw``: the floor -- one ``ray.put`` of the batch, one remote call per rank on that
  object, one ``[B, R]`` result fetched;
* ``call_dp``: megarl's dispatch (each DP chunk serialised once, only the collecting rank
  returns its output, each result fetched once);
* ``per_rank``: the dispatch before (the chunk passed by value to every rank, every rank
  returns, results fetched twice).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import ray
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def batch(rows: int, prompt: int, response: int):
    from megarl.protocol import DataProto

    seq = prompt + response
    ids = torch.randint(0, 150000, (rows, seq))
    return DataProto.from_dict({
        "input_ids": ids, "attention_mask": torch.ones(rows, seq, dtype=torch.int64),
        "position_ids": torch.arange(seq).expand(rows, seq).clone(), "responses": ids[:, prompt:].clone(),
        "response_mask": torch.ones(rows, response, dtype=torch.int64),
        "old_log_probs": torch.randn(rows, response), "advantages": torch.randn(rows, response),
    }, meta_info={"temperature": 1.0})


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--response", type=int, default=2048)
    p.add_argument("--iters", type=int, default=3)
    args = p.parse_args()
    sys.path.insert(0, REPO)
    from megarl.parallel.layout import ParallelLayout
    from megarl.trainer.resources import create_resource_pool
    from megarl.trainer.worker_group import WorkerGroup

    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=6 * 2**30,
             runtime_env={"env_vars": {"PYTHONPATH": os.path.join(REPO, "tests", "trainer") + ":" + REPO}})
    pool = create_resource_pool(1, 2, use_gpu=False, cpus_per_slot=0.5)
    group = WorkerGroup("bench", "toy_worker:ToyWorker", ("B",), {}, pool.placements, 0.25, 0.0,
                        env={"OMP_NUM_THREADS": "1"}, call_timeout_s=600, layout=ParallelLayout(world_size=2, tp=2))
    data = batch(args.rows, args.prompt, args.response)
    data.batch["values"] = data.batch["old_log_probs"]
    nbytes = sum(t.numel() * t.element_size() for t in data.batch.values())

    def raw():
        ref = ray.put(data)
        refs = [h.call.remote("row_sums", ref) for h in group.hosts]
        ray.get(refs[0])
        ray.wait(refs[1:], num_returns=len(refs) - 1)

    def call_dp():
        group.call_dp("row_sums", data)

    def per_rank():
        refs = [h.call.remote("row_sums", data) for h in group.hosts]
        ray.get(refs)
        ray.get(refs)

    arms = {"raw": raw, "call_dp": call_dp, "per_rank": per_rank}
    for fn in arms.values():
        fn()
    times = {name: [] for name in arms}
    for _ in range(args.iters):
        for name, fn in arms.items():
            times[name].append(timed(fn))
    floor = statistics.median(times["raw"])
    print(f"# dispatch: {args.rows} rows x {args.prompt}+{args.response} tokens, {nbytes / 2**20:.0f} MiB, "
          f"2 ranks in one DP group, median of {args.iters}")
    for name, t in times.items():
        m = statistics.median(t)
        print(f"{name:10s} {m:7.3f} s  {nbytes / m / 2**30:6.2f} GiB/s  {m / floor:5.2f}x raw   all {[round(x, 3) for x in t]}")
    group.shutdown()
    pool.release()
    ray.shutdown()


if __name__ == "__main__":
    main()
