"""The agent-loop contract (verl's ``AgentLoopBase`` / ``register`` / ``agent_loop_config_path``).

An agent loop turns ONE sample (a prompt, its non-tensor columns) into one trajectory: it
awaits ``ctx.engine.generate(token_ids, params)`` as many times as it wants, appends
observation tokens (tool results, environment turns) in between, and returns an
:class:`AgentLoopOutput`. The rollout worker runs one loop per sample (``rollout.n`` per
prompt), all concurrently on one event loop (:mod:`megarl.workers.async_engine`).

Which loop runs a sample: its ``agent_name`` column, else
``rollout.agent.default_agent_loop``. Names: the built-ins (``single_turn_agent``,
``tool_agent``) and those of ``rollout.agent.agent_loop_config_path``, verl's YAML list::

    - name: my_agent
      _target_: my_package.my_module.MyAgentLoop

A class is built once per rollout worker, on first use, as ``cls(ctx)``; ``self.ctx`` is replaced
by each batch's context (its sampling params) before the batch's ``run`` calls, one per sample,
which run concurrently on the same instance (keep per-sample state in ``run``).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable, Protocol

import numpy as np
from omegaconf import OmegaConf

from megarl.config.files import resolve_file

if TYPE_CHECKING:
    from megarl.config.schema.actor import RolloutConfig

# agent name -> "module.Class", imported on first use like the loops of agent_loop_config_path
AGENT_LOOPS: dict[str, str] = {
    "single_turn_agent": "megarl.agent.single_turn.SingleTurnAgentLoop",
    "tool_agent": "megarl.agent.tool_agent.ToolAgentLoop",
}


def register(name: str) -> Callable[[type], type]:
    """Class decorator: make an :class:`AgentLoopBase` subclass available as ``agent_name=name``."""

    def deco(cls: type) -> type:
        AGENT_LOOPS[name] = f"{cls.__module__}.{cls.__qualname__}"
        return cls

    return deco


@dataclass
class TokenOutput:
    """One finished request: the sampled tokens and their log-probs (``[]`` when the engine
    returned none), vLLM's finish reason (``"stop"`` | ``"length"`` | ``"abort"``) and the policy
    version of the weights that sampled each token (a request resumed across a weight update spans
    several; ``[]`` when the engine does not know its version).
    ``routed_experts``: with ``rollout.enable_rollout_routing_replay``, the experts each position of
    prompt + tokens was routed to, ``[len(prompt) + len(tokens) - 1, MoE layers, top-k]`` int16 (-1: none
    computed; the last token has no row); None otherwise."""

    token_ids: list[int]
    log_probs: list[float]
    finish_reason: str | None
    routed_experts: np.ndarray | None = None
    versions: list[int] = field(default_factory=list)


class Engine(Protocol):
    """What an agent loop generates with (the rollout worker's :class:`megarl.workers.async_engine.AsyncEngine`)."""

    async def generate(self, prompt_ids: Sequence[int], params: Any) -> TokenOutput:
        """Sample one response (``params.n`` must be 1) to ``prompt_ids``."""


@dataclass
class AgentContext:
    """What every agent loop of a rollout worker shares.

    ``sampling_params``: vLLM ``SamplingParams`` of this batch with ``n=1`` (one request per
    model turn; ``max_tokens`` is reset per turn by multi-turn loops). ``tokenizer``: the
    model's HF tokenizer (None when the model dir has none). ``eos_token_ids``: stop ids.
    """

    engine: Engine
    rollout: RolloutConfig
    tokenizer: Any
    sampling_params: Any
    pad_token_id: int
    eos_token_ids: list[int]


@dataclass
class AgentLoopOutput:
    """One trajectory. ``response_ids``: every token after the prompt, model turns and
    observations in the order the engine saw them; ``response_mask``: 1 for model tokens,
    0 for observation tokens; ``response_logprobs``: the engine's log-prob of each model
    token, 0.0 for observation tokens (same length as ``response_ids``); ``response_versions``:
    the policy version that sampled each model token (``TokenOutput.versions``), -1 for
    observation tokens (None: the loop does not report them; the rollout then stamps its model
    tokens with the oldest version the sample's requests saw). ``num_turns``:
    user + assistant + tool turns (verl's count); ``metrics``: per-sample numbers averaged
    into ``agent/*``; ``extra``: non-tensor columns added to the sample (e.g. ``tool_rewards``).
    ``routed_experts``: the experts vLLM routed each position of prompt + response to, by position from the
    prompt's first token (``[<= len(prompt) + len(response), MoE layers, top-k]`` int16, -1 where none; see
    :func:`keep_first_routes` for several turns), or None (not recorded: Megatron routes natively)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    num_turns: int
    metrics: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    routed_experts: np.ndarray | None = None
    response_versions: list[int] | None = None


def keep_first_routes(earlier: np.ndarray | None, turn: np.ndarray | None) -> np.ndarray | None:
    """The routes of a sample after one more model turn: ``turn`` covers that turn's request (prompt and
    everything so far, from position 0); a position keeps the rows of the first turn that computed it (those
    its next tokens were sampled with; a later turn may recompute it). Shapes as ``AgentLoopOutput.routed_experts``."""
    if turn is None or earlier is None:
        return earlier if turn is None else turn
    out = turn.copy()
    n = min(len(earlier), len(out))
    known = (earlier[:n] >= 0).all(axis=(1, 2))
    out[:n][known] = earlier[:n][known]
    return out


class AgentLoopBase(ABC):
    """Base of agent loops; ``ctx`` is shared by all samples of the worker."""

    def __init__(self, ctx: AgentContext) -> None:
        self.ctx = ctx

    @abstractmethod
    async def run(self, prompt_ids: list[int], sample: dict[str, Any]) -> AgentLoopOutput:
        """One trajectory from the prompt's token ids and the sample's non-tensor columns
        (``extra_info``, ``raw_prompt``, ...)."""


def import_class(target: str, what: str) -> type:
    module_name, _, class_name = target.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"{what}: cannot import {target!r} ({type(exc).__name__}: {exc})") from None


def class_entries(path: str, key: str, list_name: str, base_class: type) -> list[tuple[int, dict, type]]:
    """``(index, entry, class)`` for each entry of the YAML list ``list_name`` at ``path``
    (verl's tool / interaction files: ``class_name`` + ``config``); errors name ``key``, the file
    and the entry."""
    spec = OmegaConf.to_container(OmegaConf.load(resolve_file(path)), resolve=True)
    entries = spec.get(list_name) if isinstance(spec, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"{key}={path}: expected a mapping with a '{list_name}' list")
    out = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "class_name" not in entry:
            raise ValueError(f"{key}={path}: {list_name}[{i}] needs class_name (module.Class)")
        cls = import_class(entry["class_name"], f"{key}={path}: {list_name}[{i}]")
        if not (isinstance(cls, type) and issubclass(cls, base_class)):
            raise ValueError(f"{key}={path}: {list_name}[{i}] {entry['class_name']} is not a "
                             f"{base_class.__module__}.{base_class.__name__} subclass")
        out.append((i, entry, cls))
    return out


def load_agent_loop_config(path: str | None) -> dict[str, type]:
    """Agent name -> class: the built-ins, those registered, and those of verl's agent-loop YAML at ``path``."""
    targets = dict(AGENT_LOOPS)
    key = "actor_rollout_ref.rollout.agent.agent_loop_config_path"
    if path:
        entries = OmegaConf.to_container(OmegaConf.load(resolve_file(path)), resolve=True)
        if not isinstance(entries, list):
            raise ValueError(f"{key}={path}: expected a YAML list of {{name, _target_}}, got {type(entries).__name__}")
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict) or not {"name", "_target_"} <= set(entry):
                raise ValueError(f"{key}={path}: entry {i} needs 'name' and '_target_' (module.Class), got {entry!r}")
            targets[str(entry["name"])] = str(entry["_target_"])
    classes = {}
    for name, target in targets.items():
        cls = import_class(target, f"{key}: agent loop {name!r}")
        if not (isinstance(cls, type) and issubclass(cls, AgentLoopBase)):
            raise ValueError(f"{key}: agent loop {name!r} ({target}) is not a megarl.agent.AgentLoopBase subclass")
        classes[name] = cls
    return classes
