"""A long-tail workload for the async trainer modes' tests and benchmark: one model turn whose length
depends on the prompt. Prompts whose ``extra_info.index`` is a multiple of ``LONG_EVERY`` get
``rollout.response_length`` tokens, the others ``1 / LONG_FACTOR`` of that; with
``rollout.ignore_eos=true`` every response has exactly its length (a random policy's EOS cannot end
it early). Use it with :func:`agent_loop_overrides` (Ray workers import it as ``helpers.long_tail``:
put ``tests/`` on their PYTHONPATH)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from megarl.agent.base import AgentLoopBase, AgentLoopOutput

LONG_EVERY, LONG_FACTOR = 8, 8


class LongTailAgentLoop(AgentLoopBase):
    async def run(self, prompt_ids: list[int], sample: dict[str, Any]) -> AgentLoopOutput:
        params = self.ctx.sampling_params.clone()
        budget = int(self.ctx.rollout.response_length)
        long = int(sample["extra_info"]["index"]) % LONG_EVERY == 0
        params.max_tokens = budget if long else max(1, budget // LONG_FACTOR)
        out = await self.ctx.engine.generate(prompt_ids, params)
        tokens = out.token_ids
        return AgentLoopOutput(prompt_ids=prompt_ids, response_ids=tokens, response_mask=[1] * len(tokens),
                               response_logprobs=out.log_probs or [0.0] * len(tokens), num_turns=2,
                               response_versions=out.versions)


def agent_loop_overrides(directory: Path) -> list[str]:
    """The config overrides that make every sample run :class:`LongTailAgentLoop`."""
    path = Path(directory) / "long_tail_agent.yaml"
    path.write_text("- name: long_tail_agent\n  _target_: helpers.long_tail.LongTailAgentLoop\n")
    return [f"actor_rollout_ref.rollout.agent.agent_loop_config_path={path}",
            "actor_rollout_ref.rollout.agent.default_agent_loop=long_tail_agent",
            "actor_rollout_ref.rollout.ignore_eos=true"]
