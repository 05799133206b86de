"""Scorer of the embedded demo task "largest digit" (data: ``megarl.data.demo_data``).

The prompt lists a few random digits; the answer is the largest. The response is scored
on its first non-whitespace character (the demo tokenizer makes every digit one token,
so this is the response's first real token):

* 1.0  — it is the right digit,
* 0.1  — it is some other digit (partial credit: a random policy earns this often
  enough that GRPO groups have reward variance from step 0),
* 0.0  — anything else, including an empty response.

What follows the first character is ignored, so ``"9"``, ``" 9 3"`` and ``"93"`` all answer 9.
"""

from __future__ import annotations

DATA_SOURCE = "megarl/largest_digit"

CORRECT_SCORE = 1.0
DIGIT_SCORE = 0.1


def compute_score(solution_str: str, ground_truth: str) -> float:
    """Score one decoded response against the ground-truth digit (a string ``"0"``-``"9"``)."""
    text = solution_str.lstrip()
    if not text:
        return 0.0
    first = text[0]
    if first == str(ground_truth).strip():
        return CORRECT_SCORE
    if first in "0123456789":
        return DIGIT_SCORE
    return 0.0
