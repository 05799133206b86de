"""Agent-loop rules: what needs rollout.mode=async, what a rollout TP group cannot run, and that
the tool / agent-loop files exist (an error at start-up, not inside a worker after Ray started)."""

from __future__ import annotations

import os
from collections.abc import Iterator

from megarl.agent.base import resolve_file
from megarl.config.errors import Issue
from megarl.config.view import View

R = "actor_rollout_ref.rollout"


def agent_loop(v: View) -> Iterator[Issue]:
    mode, tp = v.get(f"{R}.mode"), v.get(f"{R}.tensor_model_parallel_size")
    multi_turn, loops = v.get(f"{R}.multi_turn.enable"), v.get(f"{R}.agent.agent_loop_config_path")
    for key in (f"{R}.multi_turn.tool_config_path", f"{R}.multi_turn.interaction_config_path",
                f"{R}.agent.agent_loop_config_path"):
        path = v.get(key)
        if path is not None and not os.path.isfile(resolve_file(path)):
            yield Issue(key, path, "file does not exist (as given, nor in the megarl checkout)",
                        f"point {key} at an existing YAML file, or set it to null")
    if mode == "sync":
        for key, value in ((f"{R}.multi_turn.enable", multi_turn), (f"{R}.agent.agent_loop_config_path", loops)):
            if value:
                yield Issue(key, value, "agent loops run only with rollout.mode=async (sync is one batched generate)",
                            f"set {R}.mode=async")
    elif tp > 1:
        # The ranks of a vLLM TP group (external_launcher) must add the same requests in the same order;
        # tool latency reorders them per rank, so only the deterministic single-turn loop runs there.
        for key, value in ((f"{R}.multi_turn.enable", multi_turn), (f"{R}.agent.agent_loop_config_path", loops)):
            if value:
                yield Issue(key, value, f"multi-turn / custom agent loops need {R}.tensor_model_parallel_size=1 "
                            "(the ranks of a rollout TP group would add requests in different orders)",
                            f"set {R}.tensor_model_parallel_size=1 (more replicas instead), or {key}=null/false")


RULES = (agent_loop,)
