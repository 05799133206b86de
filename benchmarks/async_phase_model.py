"""A model of colocate_async's generation phases on one replica: decode steps per phase vs sync's.

Each step admits prompts as megarl.trainer.v1.admission paces them (``--warmup`` batches ahead), decodes with at most
``--slots`` sequences at once (``rollout.max_num_seqs``), first come first served with the interrupted requests ahead
of the new ones (as tests/workers/test_rollout_session.py checks), and stops when the step's oldest ``--batch`` groups
are finished (strategy ``wait``). Every decode step costs the same here: on a GPU it does not (a fixed part per step
plus a part per sampled token), which is what the measured engine times are set against in benchmarks/RESULTS.md.

  python benchmarks/async_phase_model.py [--batch 32 --n 8 --long 992 --short 124 --slots 256 --warmup 2 --steps 10]
"""

from __future__ import annotations

import argparse
import math


def phases(batch: int, n: int, long: int, short: int, slots: int, warmup: int, steps: int, long_every: int = 8) -> list[int]:
    """Decode steps of each step's generation phase."""
    admitted, groups, out = 0, [], []
    for step in range(1, steps + 1):
        cap = math.floor((warmup + step) * batch) - admitted
        new = [{"idx": admitted + k, "left": [long if (admitted + k) % long_every == 0 else short] * n} for k in range(cap)]
        admitted += cap
        queue = [(g, j) for g in groups for j in range(n) if g["left"][j] > 0] + [(g, j) for g in new for j in range(n)]
        groups += new
        oldest = sorted(groups, key=lambda g: g["idx"])[:batch]
        running, waiting, t = queue[:slots], queue[slots:], 0
        while any(any(left > 0 for left in g["left"]) for g in oldest):
            t += 1
            for g, j in running:
                g["left"][j] -= 1
            running = [(g, j) for g, j in running if g["left"][j] > 0]
            while len(running) < slots and waiting:
                running.append(waiting.pop(0))
        groups = [g for g in groups if g not in oldest]
        out.append(t)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=32, help="prompts a step on this replica")
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--long", type=int, default=992)
    p.add_argument("--short", type=int, default=124)
    p.add_argument("--slots", type=int, default=256)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args()
    steps = phases(args.batch, args.n, args.long, args.short, args.slots, args.warmup, args.steps)
    print("decode steps per phase:", steps)
    print(f"mean from step 3: {sum(steps[2:]) / len(steps[2:]):.1f} (sync: {args.long} a step)")


if __name__ == "__main__":
    main()
