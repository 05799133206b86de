"""GSM8K-style scorer: the answer follows ``####`` (strict) or is the last number (flexible)."""

from __future__ import annotations

import re

_STRICT = re.compile(r"####\s*(-?[0-9.,]+)")
_NUMBER = re.compile(r"-?[0-9][0-9.,]*")


def _normalize(number: str) -> str:
    """'1,234.' -> '1234'; '3.50' -> '3.5'; '-0' -> '0'."""
    text = number.replace(",", "").replace("$", "").strip().rstrip(".")
    try:
        value = float(text)
    except ValueError:
        return text
    if value == int(value):
        return str(int(value))
    return repr(value)


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The final answer of a response, or None.

    strict: the number after the last ``####``; flexible: the last number in the text.
    """
    if method == "strict":
        matches = _STRICT.findall(solution_str)
        return _normalize(matches[-1]) if matches else None
    if method == "flexible":
        matches = [m for m in _NUMBER.findall(solution_str) if m.strip(".,")]
        return _normalize(matches[-1]) if matches else None
    raise ValueError(f"gsm8k extract method must be 'strict' or 'flexible', got {method!r}")


def compute_score(
    solution_str: str, ground_truth: str, method: str = "strict", format_score: float = 0.0, score: float = 1.0
) -> float:
    """``score`` if the extracted answer equals the ground truth, ``format_score`` if an
    answer was found but is wrong, 0.0 when none was found."""
    answer = extract_solution(solution_str, method)
    if answer is None:
        return 0.0
    return score if answer == _normalize(str(ground_truth)) else format_score
