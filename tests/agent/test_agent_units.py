"""Agent-loop pieces without an engine: tool-call bounds, truncation, the hermes parser, tool and
agent-loop YAML errors, the calculator, and the config rules of rollout.mode / multi-turn."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

import agent_fixtures as fx
from megarl.agent.base import load_agent_loop_config
from megarl.agent.calculator import CalculatorTool, evaluate
from megarl.agent.tool_call import call_tool, truncate
from megarl.agent.tool_parser import HermesToolParser, make_tool_parser
from megarl.agent.tools import load_tools


@pytest.mark.parametrize("side, expected", [
    ("left", "(truncated)...567890"), ("right", "abcdef...(truncated)"), ("middle", "abc...(truncated)...890"),
])
def test_truncate_sides(side, expected):
    assert truncate("abcdefghij1234567890", 6, side) == expected
    assert truncate("short", 6, side) == "short"


def _call(tool, timeout_s=5.0, max_chars=100):
    return asyncio.run(call_tool(tool, {}, {}, timeout_s=timeout_s, max_chars=max_chars, truncate_side="right"))


def test_a_blocking_tool_is_cut_at_its_timeout():
    start = time.perf_counter()
    result = _call(fx.SleepyTool({}, fx.schema("sleepy")), timeout_s=0.3)
    assert time.perf_counter() - start < 3 and result.error
    assert result.text == "Error: tool 'sleepy' timed out after 0.3s"


def test_a_raising_tool_becomes_a_truncated_error():
    result = _call(fx.BoomTool({}, fx.schema("boom")), max_chars=20)
    assert result.error and result.text == "Error executing tool...(truncated)"
    ok = _call(CalculatorTool({}, None))  # no expression: KeyError inside execute
    assert ok.error and "KeyError" in ok.text


class _Text:
    """A tokenizer whose decode returns fixed text (the parser only decodes)."""

    def __init__(self, text):
        self.text = text

    def decode(self, ids, skip_special_tokens=False):
        return self.text


@pytest.mark.parametrize("text, calls, malformed", [
    ('I will compute. <tool_call>{"name": "calculator", "arguments": {"expression": "7 - 9"}}</tool_call>',
     [("calculator", {"expression": "7 - 9"})], 0),
    ('<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call><tool_call>{"name": "b", "arguments": {}}</tool_call>',
     [("a", {"x": 1}), ("b", {})], 0),
    ("<tool_call>{not json}</tool_call>", [], 1),
    ('<tool_call>{"name": "a"}</tool_call>', [], 1),
    ('<tool_call>{"name": "a", "arguments": {}', [], 1),  # never closed
    ("the answer is 4", [], 0),
])
def test_hermes_parser(text, calls, malformed):
    parsed = HermesToolParser(_Text(text)).parse([1])
    assert [(c.name, c.arguments) for c in parsed.calls] == calls and parsed.malformed == malformed
    if calls:
        assert "<tool_call>" not in parsed.content


def test_unknown_format_is_named():
    with pytest.raises(ValueError, match="multi_turn.format='nope' is not a registered tool parser"):
        make_tool_parser("nope", _Text(""))


def test_calculator():
    assert (evaluate("7 - 9"), evaluate("(2 + 3) * 4"), evaluate("7 / 2"), evaluate("-3 ** 2")) == (-2, 20, 3.5, -9)
    for bad in ("__import__('os')", "2 ** 1000", "x + 1", "1 +"):
        with pytest.raises(ValueError):
            evaluate(bad)
    assert _call(CalculatorTool({}, None)).text.startswith("Error")
    result = asyncio.run(call_tool(CalculatorTool({}, None), {"expression": "6 * 7"}, {}, timeout_s=5, max_chars=50,
                                   truncate_side="middle"))
    assert (result.text, result.error) == ("42", False)


def test_tool_yaml(tmp_path):
    good = tmp_path / "tools.yaml"
    good.write_text(json.dumps({"tools": [{"class_name": "megarl.agent.calculator.CalculatorTool", "config": {"type": "native"},
                                           "tool_schema": None}]}))
    assert list(load_tools(str(good))) == ["calculator"]
    assert load_tools(None) == {}
    for body, words in [
        ({"tools": [{"class_name": "no.such.Tool", "config": {"type": "native"}}]}, "cannot import 'no.such.Tool'"),
        ({"tools": [{"class_name": "megarl.agent.calculator.evaluate"}]}, "is not a megarl.agent.tools.BaseTool subclass"),
        ({"tools": [{"class_name": "megarl.agent.calculator.CalculatorTool", "config": {"type": "mcp"}}]}, "only 'native'"),
        ({"tools": [{"class_name": "megarl.agent.calculator.CalculatorTool"}] * 2}, "two tools are named 'calculator'"),
        ({"tool": []}, "expected a mapping with a 'tools' list"),
    ]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(json.dumps(body))
        with pytest.raises(ValueError, match="multi_turn.tool_config_path") as err:
            load_tools(str(bad))
        assert words in str(err.value)


def test_agent_loop_yaml(tmp_path):
    path = tmp_path / "loops.yaml"
    path.write_text("- name: one_token\n  _target_: agent_fixtures.OneTokenAgent\n")
    assert set(load_agent_loop_config(str(path))) == {"single_turn_agent", "tool_agent", "one_token"}
    path.write_text("- name: bad\n  _target_: megarl.agent.calculator.CalculatorTool\n")
    with pytest.raises(ValueError, match="agent loop 'bad' .* is not a megarl.agent.AgentLoopBase subclass"):
        load_agent_loop_config(str(path))
    path.write_text("- name: bad\n")
    with pytest.raises(ValueError, match="entry 0 needs 'name' and '_target_'"):
        load_agent_loop_config(str(path))
