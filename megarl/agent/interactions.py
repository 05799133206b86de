"""Interactions: an environment or simulated user that answers the model's turn (verl <= 0.8's
``BaseInteraction`` contract and ``interaction_config_path`` YAML; verl 0.9.1 dropped the key,
megarl keeps it as ``rollout.multi_turn.interaction_config_path``)::

    interaction:
      - name: my_env                      # the sample picks it by extra_info.interaction_kwargs.name
        class_name: my_package.MyInteraction
        config: {}

Per sample with ``extra_info.interaction_kwargs`` (``name`` + the sample's own arguments), the tool
agent calls ``start_interaction(instance_id, **interaction_kwargs)`` once, then after each model turn
without tool calls ``generate_response(instance_id, messages, **interaction_kwargs)`` ->
``(should_terminate, user_text, turn_score, metrics)``: ``user_text`` becomes a user turn
(``response_mask=0``) unless ``should_terminate``; the scores go to the ``turn_scores`` column; at
the end ``finalize_interaction(instance_id)``. Each call is bounded like a tool call
(``multi_turn.tool_timeout_s``, its own thread); a failing call ends the sample.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from megarl.agent.base import class_entries

KEY = "actor_rollout_ref.rollout.multi_turn.interaction_config_path"


class BaseInteraction:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.name = config.get("name", "interaction_agent")

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        return instance_id or str(uuid4())

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]],
                                **kwargs: Any) -> tuple[bool, str, float, dict[str, Any]]:
        """(should_terminate, the user's reply, this turn's score, metrics)."""
        return True, "", 0.0, {}

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        return None


def load_interactions(path: str | None) -> dict[str, BaseInteraction]:
    """Interaction name -> instance from the YAML at ``path`` (empty when null)."""
    if not path:
        return {}
    out: dict[str, BaseInteraction] = {}
    for _, entry, cls in class_entries(path, KEY, "interaction", BaseInteraction):
        name = str(entry.get("name") or cls.__name__)
        if name in out:
            raise ValueError(f"{KEY}={path}: two interactions are named {name!r}")
        out[name] = cls({**(entry.get("config") or {}), "name": name})
    return out
