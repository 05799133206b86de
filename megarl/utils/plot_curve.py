"""Plot the validation-reward curve of a run from its metrics jsonl to a PNG.

    python -m megarl.utils.plot_curve checkpoints/megarl/demo_grpo/metrics.jsonl -o val_reward.png
"""

from __future__ import annotations

import argparse
import json


def read_curve(jsonl_path: str, key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of every record that has ``key``; a later record for a step wins (resumed runs)."""
    points: dict[int, float] = {}
    with open(jsonl_path) as handle:
        for line in handle:
            if line.strip():
                record = json.loads(line)
                if key in record:
                    points[int(record["step"])] = float(record[key])
    steps = sorted(points)
    return steps, [points[s] for s in steps]


def plot(jsonl_path: str, out_png: str, keys: tuple[str, ...] = ("val/reward/mean",), title: str | None = None) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    plotted = 0
    for key in keys:
        steps, values = read_curve(jsonl_path, key)
        if steps:
            ax.plot(steps, values, marker="o", markersize=3, label=key)
            plotted += 1
    if not plotted:
        raise ValueError(f"{jsonl_path}: no records with any of {list(keys)}")
    ax.set_xlabel("training step")
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(title or ("validation reward" if keys == ("val/reward/mean",) else "reward"))
    fig.tight_layout()
    fig.savefig(out_png)
    plt.close(fig)
    return out_png


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("jsonl", help="metrics.jsonl written by the trainer")
    parser.add_argument("-o", "--out", default="val_reward.png")
    parser.add_argument("--key", action="append", help="metric(s) to plot (default val/reward/mean)")
    args = parser.parse_args()
    print(plot(args.jsonl, args.out, tuple(args.key or ["val/reward/mean"])))


if __name__ == "__main__":
    main()
