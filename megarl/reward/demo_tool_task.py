"""Scorer of the demo's tool task (``megarl.data.demo_tool_data``): the final answer is exact.

The decoded response is the whole trajectory (tool call, ``<tool_response>...</tool_response>``
observation, answer); the answer is the text after the last ``</tool_response>`` (the whole text
when the model answered directly). 1.0 when it equals the ground truth, else 0.0: copying the
tool's result pays, a call alone does not (no format credit, as in ``demo_task``).
"""

from __future__ import annotations

DATA_SOURCE = "megarl/arithmetic_tool"
RESPONSE_END = "</tool_response>"
CORRECT_SCORE = 1.0


def compute_score(solution_str: str, ground_truth: str) -> float:
    """Score one decoded trajectory against the ground-truth answer (an integer as a string)."""
    final = solution_str.rsplit(RESPONSE_END, 1)[-1]
    return CORRECT_SCORE if final.strip() == str(ground_truth).strip() else 0.0
