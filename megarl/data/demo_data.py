"""Rows of the embedded demo task "largest digit" (scorer: ``megarl.reward.demo_task``).

Each prompt is one user message ``"largest digit : 3 7"`` (``NUM_DIGITS`` = 2 uniform
digits); the answer is the largest digit (``"7"``). Rows are verl-style: ``data_source``, ``prompt`` (chat messages),
``ability``, ``reward_model {style, ground_truth}``, ``extra_info {split, index}``.
Generation is seeded and platform independent (numpy PCG64).

Why this task (scored on the response's first character, see the scorer): a random-init
policy over the 64-token vocabulary starts with some digit ~1/6 of the time (reward 0.1)
and with the right one ~1/64 (reward 1.0): mean reward ~0.03 (measured 0.025 over the
first 16 x 16 samples of tests/data/test_demo_learnable.py). The answer is spread over
the digits (P(max = d) = (2d + 1) / 100), so no constant answer pays much: always "9",
the best one, earns 0.19 + 0.1 * 0.81 = 0.27 (9 is the largest of 2 uniform digits with
probability 1 - 0.9**2 = 0.19), while copying either prompt digit earns 0.55 + 0.1 * 0.45
= 0.60 and comparing them earns 1.0. With 5 digits (data version 1) "9" alone earned
0.47 and GRPO settled on it; with 2 the path to 1.0 goes through copying a prompt digit.

``DATA_VERSION`` is stamped into the parquet files; bump it whenever ``generate_rows``'
output changes, so that cached demo splits of an older version are rebuilt (``demo.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from megarl.reward.demo_task import DATA_SOURCE

NUM_DIGITS = 2
DATA_VERSION = 2  # 1: 5 digits per prompt; 2: 2 digits
VERSION_KEY = b"megarl_demo_data_version"  # parquet schema metadata key
ABILITY = "comparison"
QUESTION = "largest digit :"
SPLIT_IDS = {"train": 0, "val": 1}


def make_prompt_text(digits: list[int]) -> str:
    """The user message for ``digits``, e.g. ``"largest digit : 3 7"``."""
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
    """Write rows to a parquet file (schema inferred by pyarrow; no pandas), stamped with
    ``DATA_VERSION`` in the schema metadata."""
    table = pa.Table.from_pylist(rows)
    pq.write_table(table.replace_schema_metadata({VERSION_KEY: str(DATA_VERSION).encode()}), str(path))


def data_version(path: str | Path) -> int | None:
    """The ``DATA_VERSION`` a demo split was written with; None if unstamped or unreadable."""
    try:
        value = (pq.read_schema(str(path)).metadata or {}).get(VERSION_KEY)
        return int(value) if value is not None else None
    except (OSError, ValueError, pa.ArrowException):
        return None
