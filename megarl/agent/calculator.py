"""A calculator tool: evaluates one arithmetic expression (integers, + - * / // % ** and parentheses).

Parsed with ``ast`` (never ``eval``); exponents are capped so a call cannot run away. Example
tool YAML: ``megarl/configs/tools/calculator.yaml``.
"""

from __future__ import annotations

import ast
import operator
from typing import Any

from megarl.agent.tools import BaseTool, ToolResponse

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_MAX_EXPONENT = 64


def evaluate(expression: str) -> int | float:
    """The value of ``expression``; ValueError for anything but arithmetic on numbers."""

    def walk(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = walk(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
                raise ValueError(f"exponent {right} is larger than {_MAX_EXPONENT}")
            return _OPS[type(node.op)](left, right)
        raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")

    try:
        return walk(ast.parse(expression, mode="eval"))
    except SyntaxError as exc:
        raise ValueError(f"cannot parse {expression!r}: {exc.msg}") from None


class CalculatorTool(BaseTool):
    """``calculator(expression: str)`` -> the value as text."""

    def get_openai_tool_schema(self) -> dict[str, Any]:
        return {"type": "function", "function": {
            "name": "calculator", "description": "Evaluate an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                           "required": ["expression"]}}}

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        value = evaluate(str(parameters["expression"]))
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        return ToolResponse(text=str(value)), 0.0, {}
