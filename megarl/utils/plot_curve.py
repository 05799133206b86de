"""Plot the reward curves of a run, and its response length, from its metrics jsonl to a PNG.

    python -m megarl.utils.plot_curve checkpoints/megarl/demo_grpo/metrics.jsonl -o val_reward.png \\
        --key val/reward/mean --key critic/score/mean --length-key response_length/mean
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


def _draw(ax, jsonl_path: str, keys: tuple[str, ...], ylabel: str) -> int:
    """Plot each key that has records on ``ax``; return how many did."""
    plotted = 0
    for key in keys:
        steps, values = read_curve(jsonl_path, key)
        if steps:
            ax.plot(steps, values, marker="o", markersize=3, label=key)
            plotted += 1
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if plotted:
        ax.legend()
    return plotted


def plot(
    jsonl_path: str,
    out_png: str,
    keys: tuple[str, ...] = ("val/reward/mean",),
    title: str | None = None,
    length_keys: tuple[str, ...] = (),
) -> str:
    """Reward panel of ``keys``; with ``length_keys`` (e.g. ``response_length/mean``, in
    tokens) a second panel below it, left out when the run has no such records."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with_lengths = any(read_curve(jsonl_path, key)[0] for key in length_keys)
    fig, axes = plt.subplots(2 if with_lengths else 1, 1, figsize=(6, 5.5 if with_lengths else 3.5), dpi=120,
                             sharex=True, squeeze=False, gridspec_kw={"height_ratios": [3, 2]} if with_lengths else None)
    reward_ax = axes[0][0]
    if not _draw(reward_ax, jsonl_path, keys, "reward"):
        plt.close(fig)
        raise ValueError(f"{jsonl_path}: no records with any of {list(keys)}")
    reward_ax.set_title(title or ("validation reward" if keys == ("val/reward/mean",) else "reward"))
    if with_lengths:
        _draw(axes[1][0], jsonl_path, length_keys, "tokens")
    axes[-1][0].set_xlabel("training step")
    fig.tight_layout()
    fig.savefig(out_png)
    plt.close(fig)
    return out_png


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("jsonl", help="metrics.jsonl written by the trainer")
    parser.add_argument("-o", "--out", default="val_reward.png")
    parser.add_argument("--key", action="append", help="reward metric(s) to plot (default val/reward/mean)")
    parser.add_argument("--length-key", action="append", default=[],
                        help="length metric(s) for a second panel, e.g. response_length/mean (default: none)")
    parser.add_argument("--title", default=None)
    args = parser.parse_args()
    print(plot(args.jsonl, args.out, tuple(args.key or ["val/reward/mean"]), args.title, tuple(args.length_key)))


if __name__ == "__main__":
    main()
