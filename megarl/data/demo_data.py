"""Rows of the embedded demo task "small arithmetic" (scorer: ``megarl.reward.demo_task``).

Each prompt is one user message ``"7 - 9 ="``: two digits ``a, b`` (0-9) and ``+`` or ``-``;
the answer is the integer ``a + b`` or ``a - b`` written out, ``"-2"``, ``"13"``, ``"5"``.
The demo tokenizer makes every digit and the minus sign one token, so a response is 1-2
answer tokens then EOS (2-3 tokens). There are ``len(PROBLEMS)`` = 200 distinct problems.

Splits (verl-style rows: ``data_source``, ``prompt`` (chat messages), ``ability``,
``reward_model {style, ground_truth}``, ``extra_info {split, index}``), seeded and platform
independent (numpy PCG64):

* ``train``  — problems drawn uniformly with replacement,
* ``val``    — every problem at most once, in a seeded order (``VAL_ROWS = 200``: all of
  them, so the validation reward is the fraction of the 200 problems solved),
* ``warmup`` — drawn like ``train``; the examples of the model's warm-up (``demo_warmup``).

No constant answer pays: each of ``0``..``9`` is right for 11 of the 200 problems
((k + 1) sums + (10 - k) differences), every other answer for fewer, so the best constant
answer scores 11 / 200 = 0.055.

``DATA_VERSION`` is stamped into the parquet files and the model dir; bump it whenever
``generate_rows``' output or the task text changes, so that cached demo assets of an older
version are rebuilt (``demo.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from megarl.reward.demo_task import DATA_SOURCE

DATA_VERSION = 3  # 1: largest of 5 digits; 2: largest of 2 digits; 3: a + b / a - b
VERSION_KEY = b"megarl_demo_data_version"  # parquet schema metadata key
ABILITY = "arithmetic"
OPERATORS = ("+", "-")
SPLIT_IDS = {"train": 0, "val": 1, "warmup": 2}

# (a, operator, b) for every problem of the task, in a fixed order.
PROBLEMS: tuple[tuple[int, str, int], ...] = tuple((a, op, b) for op in OPERATORS for a in range(10) for b in range(10))


def make_prompt_text(a: int, op: str, b: int) -> str:
    """The user message of one problem, e.g. ``"7 - 9 ="``."""
    return f"{a} {op} {b} ="


def answer(a: int, op: str, b: int) -> str:
    """The ground truth of one problem, e.g. ``"-2"``."""
    if op not in OPERATORS:
        raise ValueError(f"demo operator must be one of {OPERATORS}, got {op!r}")
    return str(a + b if op == "+" else a - b)


def generate_rows(split: str, num_rows: int, seed: int) -> list[dict[str, Any]]:
    """``num_rows`` verl-style rows of ``split`` ("train", "val" or "warmup"), deterministic in ``seed``.

    Raises:
        ValueError: unknown split, or more "val" rows than there are problems.
    """
    if split not in SPLIT_IDS:
        raise ValueError(f"demo split must be one of {sorted(SPLIT_IDS)}, got {split!r}")
    rng = np.random.Generator(np.random.PCG64([seed, SPLIT_IDS[split]]))
    if split == "val":
        if num_rows > len(PROBLEMS):
            raise ValueError(f"the demo val split has at most {len(PROBLEMS)} rows (one per problem), asked for {num_rows}")
        picks = rng.permutation(len(PROBLEMS))[:num_rows]
    else:
        picks = rng.integers(0, len(PROBLEMS), size=num_rows)
    rows = []
    for index, pick in enumerate(picks.tolist()):
        problem = PROBLEMS[pick]
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": make_prompt_text(*problem)}],
                "ability": ABILITY,
                "reward_model": {"style": "rule", "ground_truth": answer(*problem)},
                "extra_info": {"split": split, "index": index},
            }
        )
    return rows


def task_corpus() -> Iterator[str]:
    """Every symbol the task's prompts and answers can contain (tokenizer training text):
    digits, ``" +"``, ``" -"``, ``" ="`` inside prompts, and ``"-"`` opening a negative answer."""
    yield make_prompt_text(1, "+", 2)
    yield make_prompt_text(3, "-", 4)
    yield " ".join(str(d) for d in range(10))
    yield "-1"


def write_rows_parquet(rows: list[dict[str, Any]], path: str | Path, version: int = DATA_VERSION) -> None:
    """Write rows to a parquet file (schema inferred by pyarrow; no pandas), stamped with
    ``version`` (``DATA_VERSION``; the tool task's ``TOOL_DATA_VERSION``) in the schema metadata."""
    table = pa.Table.from_pylist(rows)
    pq.write_table(table.replace_schema_metadata({VERSION_KEY: str(version).encode()}), str(path))


def data_version(path: str | Path) -> int | None:
    """The ``DATA_VERSION`` a demo split was written with; None if unstamped or unreadable."""
    try:
        value = (pq.read_schema(str(path)).metadata or {}).get(VERSION_KEY)
        return int(value) if value is not None else None
    except (OSError, ValueError, pa.ArrowException):
        return None
