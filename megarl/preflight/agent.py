"""The agent loops' classes, imported in the driver as the rollout workers will import them: the
agent-loop YAML's loops (and rollout.agent.default_agent_loop among them), the tool classes of
rollout.multi_turn.tool_config_path and the interaction classes of interaction_config_path. A class
that cannot be imported is a config error before Ray starts, not an exception at the first
generation. The classes are imported, not instantiated (a tool's constructor may open connections
the driver has no use for)."""

from __future__ import annotations

from typing import Any

from megarl.config.errors import Issue
from megarl.config.schema.root import MegaRLConfig

R = "actor_rollout_ref.rollout"


def agent_issues(cfg: MegaRLConfig) -> list[Issue]:
    """Issues of the agent-loop, tool and interaction classes of an async rollout (none for sync)."""
    from megarl.agent.base import class_entries, load_agent_loop_config
    from megarl.agent.interactions import BaseInteraction
    from megarl.agent.tools import BaseTool

    rollout = cfg.actor_rollout_ref.rollout
    if rollout.mode != "async":
        return []
    issues: list[Issue] = []
    key = f"{R}.agent.agent_loop_config_path"
    loops = _checked(issues, key, rollout.agent.agent_loop_config_path, lambda path: load_agent_loop_config(path))
    if loops is not None and rollout.agent.default_agent_loop not in loops:
        issues.append(Issue(f"{R}.agent.default_agent_loop", rollout.agent.default_agent_loop, "not an agent loop",
                            f"use one of {sorted(loops)}, or add it with {key}"))
    mt = rollout.multi_turn
    for key, path, list_name, base in ((f"{R}.multi_turn.tool_config_path", mt.tool_config_path, "tools", BaseTool),
                                       (f"{R}.multi_turn.interaction_config_path", mt.interaction_config_path,
                                        "interaction", BaseInteraction)):
        if path:
            _checked(issues, key, path, lambda p, k=key, n=list_name, b=base: class_entries(p, k, n, b))
    return issues


def _checked(issues: list[Issue], key: str, path: str | None, load: Any) -> Any:
    """``load(path)``, or None with its failure added to ``issues`` as a problem of ``key``."""
    try:
        return load(path)
    except Exception as error:  # the user's module: ImportError, SyntaxError, whatever its top level raises
        text = str(error).splitlines()[0] if str(error) else type(error).__name__
        problem = text.split(f"{key}={path}: ", 1)[-1].split(f"{key}: ", 1)[-1]
        issues.append(Issue(key, path, problem, "fix the class named there (its module must import in the driver's "
                                                "environment too), or its entry in the file"))
        return None
