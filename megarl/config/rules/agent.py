"""Agent-loop rules: what needs rollout.mode=async, and that the tool / agent-loop files exist (an
error at start-up, not inside a worker after Ray started). Any rollout TP size runs agent loops: at
TP > 1 the replica's first rank drives them and the others mirror its engine (megarl.workers.engine_mirror)."""

from __future__ import annotations

import os
from collections.abc import Iterator

from megarl.config.errors import Issue
from megarl.config.files import resolve_file
from megarl.config.rules.view import View

R = "actor_rollout_ref.rollout"


def agent_loop(v: View) -> Iterator[Issue]:
    mode = v.get(f"{R}.mode")
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


RULES = (agent_loop,)
