"""``single_turn_agent``: one model turn per sample (the batched rollout's result, per request)."""

from __future__ import annotations

from typing import Any

from megarl.agent.base import AgentLoopBase, AgentLoopOutput


class SingleTurnAgentLoop(AgentLoopBase):
    async def run(self, prompt_ids: list[int], sample: dict[str, Any]) -> AgentLoopOutput:
        out = await self.ctx.engine.generate(prompt_ids, self.ctx.sampling_params)
        tokens = out.token_ids
        log_probs = out.log_probs or [0.0] * len(tokens)
        return AgentLoopOutput(prompt_ids=prompt_ids, response_ids=tokens, response_mask=[1] * len(tokens),
                               response_logprobs=log_probs, num_turns=2, routed_experts=out.routed_experts,
                               response_versions=out.versions)
