"""Rows of the embedded demo task "largest digit" (scorer: ``megarl.reward.demo_task``).

Each prompt is one user message ``"largest digit : 3 7 1 5 2"``; the answer is the largest
digit (``"7"``). Rows are verl-style: ``data_source``, ``prompt`` (chat messages),
``ability``, ``reward_model {style, ground_truth}``, ``extra_info {split, index}``.
Generation is seeded and platform independent (numpy PCG64).

Why this task (scored on the response's first character, see the scorer): a random-init
policy over the 64-token vocabulary starts with some digit ~1/6 of the time (reward 0.1)
and with the right one ~1/80 (reward 1.0): mean reward ~0.03 (measured 0.028 on the demo
model), and ~80% of 8-sample groups have nonzero reward variance. Always answering "9"
already earns ~0.48 (9 is the largest of 5 uniform digits with probability
1 - 0.9**5 = 0.41); comparing the digits earns 1.0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from megarl.reward.demo_task import DATA_SOURCE

NUM_DIGITS = 5
ABILITY = "comparison"
QUESTION = "largest digit :"
SPLIT_IDS = {"train": 0, "val": 1}


def make_prompt_text(digits: list[int]) -> str:
    """The user message for ``digits``, e.g. ``"largest digit : 3 7 1 5 2"``."""
    return f"{QUESTION} {' '.join(str(d) for d in digits)}"


def generate_rows(split: str, num_rows: int, seed: int) -> list[dict[str, Any]]:
    """``num_rows`` verl-style rows of ``split`` ("train" or "val"), deterministic in ``seed``."""
    if split not in SPLIT_IDS:
        raise ValueError(f"demo split must be one of {sorted(SPLIT_IDS)}, got {split!r}")
    rng = np.random.Generator(np.random.PCG64([seed, SPLIT_IDS[split]]))
    all_digits = rng.integers(0, 10, size=(num_rows, NUM_DIGITS))
    rows = []
    for index, digits in enumerate(all_digits.tolist()):
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": make_prompt_text(digits)}],
                "ability": ABILITY,
                "reward_model": {"style": "rule", "ground_truth": str(max(digits))},
                "extra_info": {"split": split, "index": index},
            }
        )
    return rows


def task_corpus() -> Iterator[str]:
    """Every word the task's prompts and answers can contain (tokenizer training text)."""
    yield QUESTION
    yield " ".join(str(d) for d in range(10))


def write_rows_parquet(rows: list[dict[str, Any]], path: str | Path) -> None:
    """Write rows to a parquet file (schema inferred by pyarrow; no pandas)."""
    pq.write_table(pa.Table.from_pylist(rows), str(path))
