"""Tool-call parsers (``rollout.multi_turn.format``): model turn tokens -> tool calls.

A parser returns the turn's text without the calls, the well-formed calls, and how many
call blocks it could not parse (malformed JSON, missing ``name``/``arguments``); the tool
agent counts those in ``agent/malformed_tool_calls`` and ends the sample's turn loop.
Register another format with :func:`register_tool_parser`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class FunctionCall:
    """One parsed call: the function name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any]


@dataclass
class ParsedTurn:
    content: str
    calls: list[FunctionCall]
    malformed: int


class ToolParser:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def parse(self, token_ids: list[int]) -> ParsedTurn:
        raise NotImplementedError


TOOL_PARSERS: dict[str, type[ToolParser]] = {}


def register_tool_parser(name: str) -> Callable[[type[ToolParser]], type[ToolParser]]:
    def deco(cls: type[ToolParser]) -> type[ToolParser]:
        TOOL_PARSERS[name] = cls
        return cls

    return deco


@register_tool_parser("hermes")
class HermesToolParser(ToolParser):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Qwen / Hermes)."""

    BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def parse(self, token_ids: list[int]) -> ParsedTurn:
        text = self.tokenizer.decode(token_ids, skip_special_tokens=False)
        calls, malformed = [], 0
        for block in self.BLOCK.findall(text):
            try:
                call = json.loads(block)
                name, arguments = call["name"], call["arguments"]
                if isinstance(arguments, str):
                    arguments = json.loads(arguments)
                if not isinstance(name, str) or not isinstance(arguments, dict):
                    raise TypeError("name must be a string and arguments an object")
            except (ValueError, KeyError, TypeError):
                malformed += 1
                continue
            calls.append(FunctionCall(name, arguments))
        # an opened block never closed (the turn stopped inside it) is malformed too
        malformed += max(0, text.count("<tool_call>") - text.count("</tool_call>"))
        return ParsedTurn(self.BLOCK.sub("", text), calls, malformed)


def make_tool_parser(name: str, tokenizer: Any) -> ToolParser:
    if name not in TOOL_PARSERS:
        raise ValueError(f"actor_rollout_ref.rollout.multi_turn.format={name!r} is not a registered tool parser "
                         f"({sorted(TOOL_PARSERS)}; megarl.agent.tool_parser.register_tool_parser adds one)")
    if tokenizer is None:
        raise ValueError("the tool agent needs the model's tokenizer (none in actor_rollout_ref.model.path)")
    return TOOL_PARSERS[name](tokenizer)
