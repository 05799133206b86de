"""The demo task's prompts for a multi-turn run with a scripted user (issue 31 item 7: gpu_scale.sh multiturn_tp2).

  python benchmarks/multiturn_data.py SRC_DIR OUT_DIR [--replies 2]

Copies SRC_DIR/{train,val}.parquet to OUT_DIR with ``extra_info.interaction_kwargs = {name: countdown,
replies: R}`` and writes OUT_DIR/interactions.yaml (``rollout.multi_turn.interaction_config_path``) naming
``agent_fixtures.CountdownUser``, the interaction of the CPU agent-loop tests (tests/agent/agent_fixtures.py;
tests/agent on PYTHONPATH): it answers "7" to each of a sample's first R model turns, so every sample has
R + 1 assistant turns and R user turns whatever the policy writes (a random policy calls no tool) unless the
response budget runs out first.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--replies", type=int, default=2, help="user turns a sample gets")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for split in ("train.parquet", "val.parquet"):
        rows = pq.read_table(args.src / split).to_pylist()
        for row in rows:
            row["extra_info"] = {**row["extra_info"], "interaction_kwargs": {"name": "countdown", "replies": args.replies}}
        pq.write_table(pa.Table.from_pylist(rows), args.out / split)
    (args.out / "interactions.yaml").write_text(
        "interaction:\n  - name: countdown\n    class_name: agent_fixtures.CountdownUser\n    config: {}\n")
    print(f"{args.out}: train/val.parquet with {args.replies} scripted user turns a sample, interactions.yaml")


if __name__ == "__main__":
    main()
