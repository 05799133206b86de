"""A model of colocate_async's generation phases over replicas: decode steps per phase vs sync's.

Each step admits prompts as megarl.trainer.v1.admission paces them (``--warmup`` batches ahead) and hands each to
a replica: ``contiguous`` cuts every admission into equal runs (the sampler before the tenth session), ``batch_place``
gives a prompt the replica of its place in its training batch (megarl.trainer.v1.sampler.replica_of). A replica
decodes at most ``--slots`` sequences at once, first come first served with the interrupted requests ahead of the
new ones (as tests/workers/test_rollout_session.py checks). The step waits for its oldest ``--batch`` groups
(strategy ``wait``): a replica stops when its share of them is finished, or (``--conserve``, megarl.workers.phase_end)
goes on with its newer groups until every replica's share is. Prints each phase's decode steps (the slowest
replica's: what the step waits for) and the replicas' mean busy steps. Every decode step costs the same here: on a
GPU it does not (a fixed part per step plus a part per sampled token; benchmarks/RESULTS.md, ninth session).

  python benchmarks/async_phase_model.py [--batch 64 --replicas 4 --assign batch_place --conserve ...]
"""

from __future__ import annotations

import argparse
import math
import random

from megarl.trainer.v1.sampler import replica_of


def _replica(index: int, first: int, count: int, batch: int, replicas: int, assign: str) -> int:
    if assign == "batch_place":
        return replica_of(index, batch, replicas)
    per = math.ceil(count / replicas)  # contiguous runs of an admission (the last one short)
    return (index - first) // per


def phases(batch: int, n: int, long: int, short: int, slots: int, warmup: int, steps: int, replicas: int = 1,
           assign: str = "batch_place", conserve: bool = False, long_every: int = 8,
           shuffle_seed: int | None = None) -> list[tuple[int, float]]:
    """Per step: (decode steps of the phase, the replicas' mean decode steps with work to do). A prompt is long
    when its dataset index is a multiple of ``long_every`` (tests/helpers/long_tail.py); ``shuffle_seed``: the
    loader's order is a random permutation (verl's ``data.shuffle``), else the dataset's."""
    total = (warmup + steps + 1) * batch
    order = random.Random(shuffle_seed).sample(range(total), total) if shuffle_seed is not None else range(total)
    admitted, groups, out = 0, [], []
    queues: list[list] = [[] for _ in range(replicas)]  # per replica: (group, sample) not yet finished, in order
    for step in range(1, steps + 1):
        cap = math.floor((warmup + step) * batch) - admitted
        new = [{"idx": admitted + k, "left": [long if order[admitted + k] % long_every == 0 else short] * n,
                "replica": _replica(admitted + k, admitted, cap, batch, replicas, assign)} for k in range(cap)]
        admitted += cap
        groups += new
        for g in new:
            queues[g["replica"]] += [(g, j) for j in range(n)]
        oldest = sorted(groups, key=lambda g: g["idx"])[:batch]
        running = [q[:slots] for q in queues]
        waiting = [q[slots:] for q in queues]
        own_done = [not any(left > 0 for g in oldest if g["replica"] == r for left in g["left"]) for r in range(replicas)]
        t, busy = 0, [0] * replicas
        while not all(own_done):
            t += 1
            for r in range(replicas):
                if own_done[r] and not conserve:
                    continue
                if running[r]:
                    busy[r] += 1
                for g, j in running[r]:
                    g["left"][j] -= 1
                running[r] = [(g, j) for g, j in running[r] if g["left"][j] > 0]
                while len(running[r]) < slots and waiting[r]:
                    running[r].append(waiting[r].pop(0))
                own_done[r] = not any(left > 0 for g in oldest if g["replica"] == r for left in g["left"])
        queues = [running[r] + waiting[r] for r in range(replicas)]  # interrupted ahead of the rest
        groups = [g for g in groups if g not in oldest]
        out.append((t, sum(busy) / replicas))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=64, help="prompts a step (all replicas)")
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--long", type=int, default=992)
    p.add_argument("--short", type=int, default=124)
    p.add_argument("--slots", type=int, default=256, help="sequences a replica decodes at once")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--assign", choices=("contiguous", "batch_place"), default="batch_place")
    p.add_argument("--conserve", action="store_true", help="replicas generate on until every share is finished")
    p.add_argument("--shuffle-seed", type=int, default=None, help="prompts in a random order (which are long)")
    args = p.parse_args()
    rows = phases(args.batch, args.n, args.long, args.short, args.slots, args.warmup, args.steps, args.replicas,
                  args.assign, args.conserve, shuffle_seed=args.shuffle_seed)
    print("decode steps per phase (slowest replica):", [t for t, _ in rows])
    print("replicas' mean busy steps per phase:     ", [round(b) for _, b in rows])
    tail = rows[2:]
    print(f"mean from step 3: {sum(t for t, _ in tail) / len(tail):.1f} (sync: {args.long} a step)")


if __name__ == "__main__":
    main()
