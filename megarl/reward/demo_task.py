"""Scorer of the embedded demo task "small arithmetic" (data: ``megarl.data.demo_data``).

The prompt is ``"7 - 9 ="``; the answer is the integer written out (``"-2"``). The decoded
response (special tokens such as EOS already removed) is compared with the ground truth
after stripping surrounding whitespace:

* 1.0 — exactly the right answer (``"-2"``, ``" -2"``),
* 0.0 — anything else (``"2"``, ``"-2 1"``, ``"-02"``, ``""``).

No partial or format credit: the warm-up (``megarl.data.demo_warmup``) already writes
well-formed answers, so the reward only has to say which of them are right, and a format
bonus would pay a policy for being confidently wrong.
"""

from __future__ import annotations

DATA_SOURCE = "megarl/arithmetic"

CORRECT_SCORE = 1.0


def compute_score(solution_str: str, ground_truth: str) -> float:
    """Score one decoded response against the ground-truth answer (an integer as a string)."""
    return CORRECT_SCORE if solution_str.strip() == str(ground_truth).strip() else 0.0
