"""Rows of the demo's tool task "two-digit arithmetic with a calculator" (scorer:
``megarl.reward.demo_tool_task``; tool: ``megarl.agent.calculator``; run it with ``+tools=calculator``).

Each prompt is one user message ``"47 + 58 ="``: two operands ``a, b`` in 10..99 and ``+`` or
``-``; the answer is the integer written out (``"105"``, ``"-11"``). The tiny demo model cannot
do this arithmetic (the warm-up's direct answers are right ~5% of the time) but can copy:
the rewarded route is to call the calculator with the problem's expression and copy its
result, i.e. the trajectory (``CALL_OPEN`` / ``CALL_CLOSE`` are single tokens of the tool
tokenizer, ``megarl.data.demo_tokenizer``)::

    <tool_call>{"name": "calculator", "arguments": {"expression": "47 + 58"}}</tool_call><eos>
    <tool_response>105</tool_response><|assistant|>105<eos>

The warm-up (``megarl.data.demo_warmup.warm_up_tools``) writes that trajectory for
``TOOL_CALL_FRACTION`` of its rows and a direct answer for the rest, so the starting policy
calls the tool at that low rate (sampled) and answers directly when greedy; GRPO has to
learn to call it.

Splits as ``demo_data``: ``train`` (drawn with replacement), ``val`` (distinct problems,
``TOOL_VAL_ROWS``), ``warmup``. ``TOOL_DATA_VERSION`` is stamped like ``DATA_VERSION``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from megarl.data.demo_data import ABILITY, OPERATORS, SPLIT_IDS, answer, make_prompt_text
from megarl.reward.demo_tool_task import DATA_SOURCE

TOOL_DATA_VERSION = 1
OPERANDS = range(10, 100)
TOOL_NAME = "calculator"
# The JSON around the expression of a call, one token each in the tool tokenizer.
CALL_OPEN = '{"name": "calculator", "arguments": {"expression": "'
CALL_CLOSE = '"}}'
TOOL_CALL_FRACTION = 0.25  # warm-up rows that call the tool: the starting policy's sampled call rate

PROBLEMS: tuple[tuple[int, str, int], ...] = tuple((a, op, b) for op in OPERATORS for a in OPERANDS for b in OPERANDS)


def expression(a: int, op: str, b: int) -> str:
    """The calculator expression of a problem, e.g. ``"47 + 58"`` (the prompt without ``" ="``)."""
    return f"{a} {op} {b}"


def tool_call_text(expr: str) -> str:
    """A model turn calling the calculator on ``expr`` (hermes format, ``megarl.agent.tool_parser``)."""
    return f"<tool_call>{CALL_OPEN}{expr}{CALL_CLOSE}</tool_call>"


def generate_tool_rows(split: str, num_rows: int, seed: int) -> list[dict[str, Any]]:
    """``num_rows`` verl-style rows of ``split`` ("train", "val" or "warmup"), deterministic in ``seed``;
    ``extra_info.expression`` is the problem's calculator expression."""
    if split not in SPLIT_IDS:
        raise ValueError(f"demo split must be one of {sorted(SPLIT_IDS)}, got {split!r}")
    rng = np.random.Generator(np.random.PCG64([seed, SPLIT_IDS[split], 17]))
    if split == "val":
        picks = rng.permutation(len(PROBLEMS))[:num_rows]
    else:
        picks = rng.integers(0, len(PROBLEMS), size=num_rows)
    rows = []
    for index, pick in enumerate(picks.tolist()):
        a, op, b = PROBLEMS[pick]
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": make_prompt_text(a, op, b)}],
            "ability": ABILITY,
            "reward_model": {"style": "rule", "ground_truth": answer(a, op, b)},
            "extra_info": {"split": split, "index": index, "expression": expression(a, op, b)},
        })
    return rows
