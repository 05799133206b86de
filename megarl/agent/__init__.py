"""Agent loops for rollout.mode=async: verl's agent-loop, tool and tool-parser contracts.

* :mod:`megarl.agent.base` — AgentLoopBase, register, agent_loop_config_path loading;
* :mod:`megarl.agent.single_turn`, :mod:`megarl.agent.tool_agent` — the built-in loops;
* :mod:`megarl.agent.tools`, :mod:`megarl.agent.tool_call` — tools, their YAML and bounded calls;
* :mod:`megarl.agent.tool_parser` — tool-call formats (rollout.multi_turn.format);
* :mod:`megarl.agent.batch` — trajectories -> the rollout DataProto;
* :mod:`megarl.agent.interactions` — environment / simulated-user turns (interaction_config_path);
* :mod:`megarl.agent.calculator` — the demo's calculator tool.
"""

from megarl.agent.base import AgentContext, AgentLoopBase, AgentLoopOutput, register
from megarl.agent.tools import BaseTool, ToolResponse

__all__ = ["AgentContext", "AgentLoopBase", "AgentLoopOutput", "BaseTool", "ToolResponse", "register"]
