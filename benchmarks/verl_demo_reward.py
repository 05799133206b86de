"""verl ``custom_reward_function`` for the demo arithmetic task (benchmarks/verl_side_by_side.sh).

verl's reward manager calls ``compute_score(data_source=..., solution_str=..., ground_truth=...,
extra_info=...)`` per response; the score is megarl's own exact-match scorer, so both stacks are
rewarded alike (1.0 for the right integer, else 0.0).
"""

from __future__ import annotations

from typing import Any

from megarl.reward.demo_task import compute_score as demo_task_score


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **_: Any) -> float:
    """Score one decoded response of the demo task (``data_source`` is ``megarl/arithmetic``)."""
    return demo_task_score(solution_str, ground_truth)
