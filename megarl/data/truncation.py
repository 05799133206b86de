"""Prompt truncation modes of ``data.truncation``."""

from __future__ import annotations

from typing import Sequence

TRUNCATION_MODES = ("error", "left", "right", "middle")


class PromptTooLong(ValueError):
    """Raised by :func:`truncate_prompt` in mode ``error``."""


def truncate_prompt(token_ids: Sequence[int], max_length: int, mode: str) -> list[int]:
    """Cut ``token_ids`` to at most ``max_length`` tokens.

    * ``left``   keeps the last ``max_length`` tokens (drops the start),
    * ``right``  keeps the first ``max_length`` tokens,
    * ``middle`` keeps the first ``max_length // 2`` and the last ``max_length - max_length // 2``,
    * ``error``  raises :class:`PromptTooLong`.
    """
    if mode not in TRUNCATION_MODES:
        raise ValueError(f"data.truncation must be one of {TRUNCATION_MODES}, got {mode!r}")
    token_ids = list(token_ids)
    if len(token_ids) <= max_length:
        return token_ids
    if mode == "error":
        raise PromptTooLong(f"prompt has {len(token_ids)} tokens > data.max_prompt_length={max_length}")
    if mode == "left":
        return token_ids[len(token_ids) - max_length :]
    if mode == "right":
        return token_ids[:max_length]
    head = max_length // 2
    tail = max_length - head
    return token_ids[:head] + (token_ids[len(token_ids) - tail :] if tail else [])
