"""``tool_agent``: model turn -> tool calls -> observation -> model turn ... (verl's ToolAgentLoop).

Per sample, until a limit ends it:

1. the engine samples a model turn from prompt + everything so far (``max_tokens`` = what is
   left of ``rollout.response_length``); its tokens get ``response_mask=1`` and the engine's
   log-probs;
2. the turn ends the sample when the response is full, ``multi_turn.max_assistant_turns`` or
   ``max_user_turns`` is reached, or a call block is malformed (counted in
   ``agent/malformed_tool_calls``); a turn without tool calls ends it too, unless the sample has an
   interaction (megarl.agent.interactions), whose reply becomes the next user turn;
3. otherwise (tool calls) its first ``max_parallel_calls`` calls run concurrently (megarl.agent.tool_call:
   errors, timeouts and overlong text become the observation), and the tool messages, rendered
   by the chat template as the next turn would see them (generation prompt included), are
   appended with ``response_mask=0`` and log-prob 0.0. An observation that does not fit in the
   response ends the sample without it (verl).

Observation tokens are the chat template's rendering of ``[user, assistant] + tool messages``
minus that of ``[user, assistant]`` (plus any text the template puts after the end-of-turn
token), so the trained sequence is exactly what the engine was given next.
"""

from __future__ import annotations

import asyncio
from typing import Any

from megarl.agent.base import AgentContext, AgentLoopBase, AgentLoopOutput, keep_first_routes
from megarl.agent.interactions import load_interactions
from megarl.agent.tool_call import CallResult, call_tool, run_bounded, truncate
from megarl.agent.tool_parser import FunctionCall, make_tool_parser
from megarl.agent.tools import load_tools

_BASE = [{"role": "user", "content": "."}, {"role": "assistant", "content": "."}]


class ToolAgentLoop(AgentLoopBase):
    def __init__(self, ctx: AgentContext) -> None:
        super().__init__(ctx)
        mt = ctx.rollout.multi_turn
        if not mt.enable:
            raise ValueError("a sample is routed to the multi-turn agent loop 'tool_agent' (its agent_name column or "
                             "actor_rollout_ref.rollout.agent.default_agent_loop) but "
                             "actor_rollout_ref.rollout.multi_turn.enable=false; set it to true")
        self.max_assistant_turns = mt.max_assistant_turns
        self.max_user_turns = mt.max_user_turns
        self.max_parallel_calls = mt.max_parallel_calls
        self.max_chars = mt.max_tool_response_length
        self.truncate_side = mt.tool_response_truncate_side
        self.timeout_s = mt.tool_timeout_s
        self.tools = load_tools(mt.tool_config_path)
        self.interactions = load_interactions(mt.interaction_config_path)
        self.parser = make_tool_parser(mt.format, ctx.tokenizer)
        self.response_length = ctx.rollout.response_length
        tok = ctx.tokenizer
        self._base_text = tok.apply_chat_template(_BASE, tokenize=False)
        eos_text = tok.decode(ctx.eos_token_ids[:1]) if ctx.eos_token_ids else ""
        cut = self._base_text.rfind(eos_text) if eos_text else -1
        # what the template writes after the model's end-of-turn token (e.g. "\n"): the model stopped before it
        self._after_eos = self._base_text[cut + len(eos_text):] if cut >= 0 else ""

    def observation_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """Tokens of ``messages`` (tool turns) as the chat template renders them after a model turn,
        ending with the generation prompt of the next model turn."""
        tok = self.ctx.tokenizer
        full = tok.apply_chat_template(_BASE + messages, tokenize=False, add_generation_prompt=True)
        if not full.startswith(self._base_text):
            raise ValueError("the chat template renders a conversation's start differently once tool messages follow; "
                             "megarl's tool agent needs a template whose rendering of earlier turns does not change")
        return tok(self._after_eos + full[len(self._base_text):], add_special_tokens=False)["input_ids"]

    async def _call(self, call: FunctionCall, tools_kwargs: dict[str, Any]) -> CallResult:
        tool = self.tools.get(call.name)
        if tool is None:
            text = f"Error: unknown tool '{call.name}' (tools: {sorted(self.tools)})"
            return CallResult(truncate(text, self.max_chars, self.truncate_side), 0.0, True, 0.0)
        return await call_tool(tool, call.arguments, tools_kwargs.get(call.name) or {}, timeout_s=self.timeout_s,
                               max_chars=self.max_chars, truncate_side=self.truncate_side)

    def _interaction(self, extra_info: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """The sample's interaction (``extra_info.interaction_kwargs.name``) and its kwargs, or (None, {})."""
        kwargs = extra_info.get("interaction_kwargs") or {}
        if not kwargs:
            return None, {}
        name = kwargs.get("name")
        if name not in self.interactions:
            raise ValueError(f"extra_info.interaction_kwargs.name={name!r} is not an interaction of "
                             f"actor_rollout_ref.rollout.multi_turn.interaction_config_path ({sorted(self.interactions)})")
        return self.interactions[name], kwargs

    def _start_messages(self, prompt_ids: list[int], sample: dict[str, Any]) -> list[dict[str, Any]]:
        """The conversation an interaction sees: the row's chat (``raw_prompt``, data.return_raw_chat) or the
        decoded prompt as one user message."""
        raw = sample.get("raw_prompt")
        if raw is not None:
            return [dict(m) for m in raw]
        return [{"role": "user", "content": self.ctx.tokenizer.decode(prompt_ids, skip_special_tokens=True)}]

    async def run(self, prompt_ids: list[int], sample: dict[str, Any]) -> AgentLoopOutput:
        extra_info = sample.get("extra_info") or {}
        tools_kwargs = extra_info.get("tools_kwargs") or {}
        interaction, interaction_kwargs = self._interaction(extra_info)
        instance = None
        messages: list[dict[str, Any]] = []
        turn_scores: list[float] = []
        interaction_errors = 0
        if interaction is not None:
            messages = self._start_messages(prompt_ids, sample)
            try:
                instance = await run_bounded(lambda: interaction.start_interaction(None, **interaction_kwargs),
                                             self.timeout_s, f"interaction-{interaction.name}")
            except Exception:
                interaction, interaction_errors = None, 1
        try:
            out, failed = await self._turns(prompt_ids, tools_kwargs, interaction, instance, interaction_kwargs,
                                            messages, turn_scores)
            interaction_errors += failed
        finally:
            if instance is not None:
                try:
                    await run_bounded(lambda: interaction.finalize_interaction(instance), self.timeout_s,
                                      f"interaction-{interaction.name}")
                except Exception:
                    interaction_errors += 1
        if self.interactions:
            out.metrics["agent/interaction_errors"] = float(interaction_errors)
            out.extra["turn_scores"] = turn_scores
        return out

    async def _turns(self, prompt_ids: list[int], tools_kwargs: dict[str, Any], interaction: Any, instance: Any,
                     interaction_kwargs: dict[str, Any], messages: list[dict[str, Any]],
                     turn_scores: list[float]) -> tuple[AgentLoopOutput, int]:
        """The turn loop (module docstring); appends to ``messages`` / ``turn_scores``. Returns the
        trajectory and how many interaction calls failed (a failure ends the sample)."""
        response: list[int] = []
        mask: list[int] = []
        log_probs: list[float] = []
        routes = None
        versions: list[int] = []
        assistant_turns = user_turns = malformed = interaction_errors = 0
        results: list[CallResult] = []
        while True:
            params = self.ctx.sampling_params.clone()
            params.max_tokens = self.response_length - len(response)
            out = await self.ctx.engine.generate(prompt_ids + response, params)
            routes = keep_first_routes(routes, out.routed_experts)
            response += out.token_ids
            mask += [1] * len(out.token_ids)
            log_probs += out.log_probs or [0.0] * len(out.token_ids)
            versions += out.versions
            assistant_turns += 1
            if (len(response) >= self.response_length
                    or (self.max_assistant_turns and assistant_turns >= self.max_assistant_turns)
                    or (self.max_user_turns and user_turns >= self.max_user_turns)):
                break
            parsed = self.parser.parse(out.token_ids)
            malformed += parsed.malformed
            if parsed.malformed:
                break
            if interaction is not None:  # the conversation the interaction sees
                messages.append({"role": "assistant",
                                 "content": self.ctx.tokenizer.decode(out.token_ids, skip_special_tokens=True)})
            if parsed.calls:
                turn = await asyncio.gather(*(self._call(c, tools_kwargs) for c in parsed.calls[: self.max_parallel_calls]))
                results += turn
                added = [{"role": "tool", "content": r.text} for r in turn]
            elif interaction is not None:
                try:
                    done, text, score, _ = await run_bounded(
                        lambda: interaction.generate_response(instance, list(messages), **interaction_kwargs),
                        self.timeout_s, f"interaction-{interaction.name}")
                except Exception:
                    interaction_errors += 1
                    break
                turn_scores.append(float(score))
                if done:
                    break
                added = [{"role": "user", "content": str(text)}]
            else:
                break
            messages += added
            observation = self.observation_ids(added)
            if len(response) + len(observation) >= self.response_length:
                break
            response += observation
            mask += [0] * len(observation)
            log_probs += [0.0] * len(observation)
            versions += [-1] * len(observation)
            user_turns += 1
        metrics = {
            "agent/assistant_turns": float(assistant_turns), "agent/user_turns": float(user_turns),
            "agent/tool_calls": float(len(results)), "agent/tool_errors": float(sum(r.error for r in results)),
            "agent/malformed_tool_calls": float(malformed),
        }
        if results:
            metrics["agent/tool_latency_s"] = sum(r.seconds for r in results) / len(results)
        return AgentLoopOutput(prompt_ids=prompt_ids, response_ids=response, response_mask=mask,
                               response_logprobs=log_probs, num_turns=assistant_turns + user_turns + 1,
                               metrics=metrics, extra={"tool_rewards": [r.reward for r in results]},
                               routed_experts=routes,
                               response_versions=versions if len(versions) == len(response) else None), interaction_errors
