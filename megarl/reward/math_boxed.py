"""Boxed-answer math scorer: compare the last ``\\boxed{...}`` with the ground truth after
light LaTeX normalization (spaces, ``\\left``/``\\right``, ``\\dfrac``, ``\\text{}``, units
of degrees, trailing ``.``, ``x=`` prefixes)."""

from __future__ import annotations

import re


def last_boxed(text: str) -> str | None:
    """Contents of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced; None if absent."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    open_brace = text.find("{", start)
    if open_brace < 0:
        # "\boxed 5" form
        rest = text[start:].split(None, 1)
        return rest[1].split("$")[0].strip() if len(rest) == 2 else None
    depth = 0
    for i in range(open_brace, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_brace + 1 : i]
    return None


_REPLACEMENTS = (
    ("\\left", ""), ("\\right", ""), ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"),
    ("\\!", ""), ("\\,", ""), ("\\;", ""), ("^\\circ", ""), ("^{\\circ}", ""), ("\\$", ""), ("$", ""),
    ("\\%", ""), ("%", ""),
)


def normalize_answer(answer: str) -> str:
    """Canonical string for comparison: '\\dfrac{1}{2}' == '\\frac12' == '1/2' is NOT claimed;
    only presentation differences are removed."""
    text = answer.strip()
    text = re.sub(r"\\text\{(.*?)\}", r"\1", text)
    text = re.sub(r"\\mbox\{(.*?)\}", r"\1", text)
    for old, new in _REPLACEMENTS:
        text = text.replace(old, new)
    text = re.sub(r"^[a-zA-Z]\s*=", "", text)  # "x = 5" -> "5"
    text = text.replace(" ", "").rstrip(".")
    text = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", text)
    text = re.sub(r"^0\.", ".", text) if re.fullmatch(r"0\.\d+", text) else text
    if re.fullmatch(r"-?[\d,]+(\.\d+)?", text):
        text = text.replace(",", "")
        value = float(text)
        text = str(int(value)) if value == int(value) else repr(value)
    return text


def compute_score(solution_str: str, ground_truth: str) -> float:
    """1.0 if the last boxed answer matches ``ground_truth`` (itself boxed or plain), else 0.0."""
    answer = last_boxed(solution_str)
    if answer is None:
        return 0.0
    truth = last_boxed(str(ground_truth))
    truth = str(ground_truth) if truth is None else truth
    return 1.0 if normalize_answer(answer) == normalize_answer(truth) else 0.0
