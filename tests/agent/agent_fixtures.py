"""Tools, tool parsers and an agent loop for the agent-loop tests (importable by their YAML files)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from megarl.agent.base import AgentLoopBase, AgentLoopOutput
from megarl.agent.tool_parser import FunctionCall, ParsedTurn, ToolParser, register_tool_parser
from megarl.agent.tools import BaseTool, ToolResponse

ECHO_TEXT = "42"
LIFECYCLE: list[tuple[str, Any]] = []  # (event, kwargs) of EchoTool calls, in order


def schema(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}


class EchoTool(BaseTool):
    """Returns ECHO_TEXT; records its lifecycle and the sample's tools_kwargs."""

    async def create(self, instance_id=None, **kwargs):
        LIFECYCLE.append(("create", kwargs))
        return "inst", ToolResponse()

    async def execute(self, instance_id, parameters, **kwargs):
        LIFECYCLE.append(("execute", parameters))
        return ToolResponse(text=ECHO_TEXT), 0.25, {}

    async def calc_reward(self, instance_id, **kwargs):
        LIFECYCLE.append(("calc_reward", kwargs))
        return 0.5

    async def release(self, instance_id, **kwargs):
        LIFECYCLE.append(("release", kwargs))


class JitterTool(BaseTool):
    """Answers ECHO_TEXT after blocking its thread for the sample's delay on this rank (``RANK``, 0 outside
    a torch.distributed job): ``create_kwargs={"sleep_s": [rank 0's, rank 1's]}``, so the same samples come
    back from it in a different order on each rank."""

    async def create(self, instance_id=None, create_kwargs=None, **kwargs):
        delays = (create_kwargs or {}).get("sleep_s", [0.0, 0.0])
        return str(delays[int(os.environ.get("RANK", "0"))]), ToolResponse()  # the instance id carries the delay

    async def execute(self, instance_id, parameters, **kwargs):
        time.sleep(float(instance_id))
        return ToolResponse(text=ECHO_TEXT), 0.0, {}


class BoomTool(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        raise RuntimeError("kaput")


class SleepyTool(BaseTool):
    """Blocks its thread (not awaitable): only the per-call timeout can end the wait."""

    async def execute(self, instance_id, parameters, **kwargs):
        time.sleep(30)
        return ToolResponse(text="late"), 0.0, {}


class HugeTool(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text="1234567890" * 100), 0.0, {}


class CallsTool(ToolParser):
    """Every model turn calls the tool named by the class attribute (tests switch it)."""

    tool = "echo"
    calls_per_turn = 1

    def parse(self, token_ids: list[int]) -> ParsedTurn:
        return ParsedTurn("", [FunctionCall(CallsTool.tool, {"turn_tokens": len(token_ids)})] * CallsTool.calls_per_turn, 0)


class MalformedCall(ToolParser):
    def parse(self, token_ids: list[int]) -> ParsedTurn:
        return ParsedTurn("", [], 1)


register_tool_parser("test_calls_tool")(CallsTool)
register_tool_parser("test_malformed")(MalformedCall)


class OneTokenAgent(AgentLoopBase):
    """A custom loop (agent_loop_config_path): one greedy-budget turn of exactly one token."""

    async def run(self, prompt_ids, sample):
        params = self.ctx.sampling_params.clone()
        params.max_tokens = 1
        params.ignore_eos = True
        out = await self.ctx.engine.generate(prompt_ids, params)
        await asyncio.sleep(0)
        return AgentLoopOutput(prompt_ids, out.token_ids, [1], out.log_probs or [0.0], num_turns=7)


from megarl.agent.interactions import BaseInteraction  # noqa: E402

SEEN: list[list[dict]] = []  # the messages each generate_response call saw


class CountdownUser(BaseInteraction):
    """Replies "7" (score 0.5) to the first ``replies`` model turns of an instance, then ends (score 1.0)."""

    def __init__(self, config):
        super().__init__(config)
        self.left: dict[str, int] = {}

    async def start_interaction(self, instance_id=None, replies=2, **kwargs):
        instance_id = instance_id or f"i{len(self.left)}"
        self.left[instance_id] = replies
        return instance_id

    async def generate_response(self, instance_id, messages, **kwargs):
        SEEN.append(messages)
        if self.left[instance_id] == 0:
            return True, "", 1.0, {}
        self.left[instance_id] -= 1
        return False, "7", 0.5, {}

    async def finalize_interaction(self, instance_id, **kwargs):
        del self.left[instance_id]
