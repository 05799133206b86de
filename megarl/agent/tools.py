"""Tools of the tool agent (verl's ``BaseTool`` contract and ``tool_config_path`` YAML).

``rollout.multi_turn.tool_config_path`` (verl's format)::

    tools:
      - class_name: megarl.agent.calculator.CalculatorTool
        config: {type: native}
        tool_schema:            # OpenAI function schema; null: the class's get_openai_tool_schema()
          type: function
          function: {name: calculator, description: ..., parameters: {...}}

Per call the tool agent runs ``create(create_kwargs)`` -> ``execute(instance_id, arguments)``
-> ``calc_reward(instance_id, **calc_reward_kwargs)`` -> ``release(instance_id,
**release_kwargs)``, the kwargs from the sample's ``extra_info.tools_kwargs[<tool name>]``
(megarl.agent.tool_call). Tool schemas are not rendered into the prompt (the driver
tokenizes prompts once; data.tool_config_path is refused): the prompt must describe the tools.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import uuid4

from megarl.agent.base import class_entries

KEY = "actor_rollout_ref.rollout.multi_turn.tool_config_path"


@dataclass
class ToolResponse:
    """What the model sees from a tool (text only in megarl)."""

    text: str | None = None


class BaseTool:
    """A tool: ``config`` is the YAML's ``config`` mapping, ``tool_schema`` the OpenAI function schema
    (a dict with ``function.name``)."""

    def __init__(self, config: dict[str, Any], tool_schema: dict[str, Any] | None) -> None:
        self.config = config
        self.tool_schema = tool_schema or self.get_openai_tool_schema()
        try:
            self.name = str(self.tool_schema["function"]["name"])
        except (TypeError, KeyError):
            raise ValueError(f"{KEY}: tool {type(self).__name__} has no tool_schema.function.name") from None

    def get_openai_tool_schema(self) -> dict[str, Any] | None:
        return None

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        return instance_id or str(uuid4()), ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        """Returns (response, step reward, tool metrics)."""
        return ToolResponse(text="Updated the tool state."), 0.0, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        return None


def load_tools(path: str | None) -> dict[str, BaseTool]:
    """Tool name -> tool instance from verl's tool YAML (empty when ``path`` is null)."""
    if not path:
        return {}
    tools: dict[str, BaseTool] = {}
    for i, entry, cls in class_entries(path, KEY, "tools", BaseTool):
        config = entry.get("config") or {}
        if config.get("type", "native") != "native":
            raise ValueError(f"{KEY}={path}: tools[{i}].config.type={config.get('type')!r}: only 'native' tools exist")
        tool = cls(config=config, tool_schema=entry.get("tool_schema"))
        if tool.name in tools:
            raise ValueError(f"{KEY}={path}: two tools are named {tool.name!r}")
        tools[tool.name] = tool
    return tools
