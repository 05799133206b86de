"""Streamed scoring: ``reward.launch_reward_fn_async=true`` with ``rollout.mode=async`` scores each sample
the moment its agent loop returns, while the engine keeps generating the others (verl 0.9's agent loop
hands each finished trajectory to a reward-loop worker the same way).

The rollout worker wraps each agent-loop coroutine in :meth:`StreamingReward.scored`: when the loop
returns, the sample's scoring call (the row the driver's manager would build from the batch:
data_source, the decoded trajectory cut to the response length, ground truth, extra_info) runs on one
of ``reward.num_workers`` scoring threads, each handing it to one of the manager's scoring processes
(bounded by ``reward.timeout``, and by ``reward.phase_timeout`` from the moment the loop returned); the
event loop does not wait for it, so the engine steps on. After the batch, :meth:`collect` turns the
outcomes into ``token_level_scores`` ``[B, R]`` and reward_extra_info exactly as the driver's manager
does (``RewardManager.collect``: same errors, timeouts, rows left unscored, dapo penalty). Not for ``reward_manager.name=batch``
(one call for the whole batch: the trainer scores it after the rollout, in the background).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable

import torch

from megarl.agent.base import AgentLoopOutput
from megarl.reward.managers import RewardSpec, make_reward_manager
from megarl.reward.scoring_pool import Outcome


class StreamingReward:
    """Scores samples as their agent loops finish. ``spec``: the driver's reward spec; ``tokenizer``:
    the model's (decodes trajectories as the driver's data tokenizer does); ``response_length``:
    ``rollout.response_length`` (the batch keeps that many response tokens)."""

    def __init__(self, spec: RewardSpec, tokenizer: Any, response_length: int) -> None:
        self.manager = make_reward_manager(spec, tokenizer)
        self.response_length = response_length
        # one thread per scoring process: rows that finish together are scored at once (reward.num_workers)
        self.executor = ThreadPoolExecutor(max_workers=self.manager.pool.processes, thread_name_prefix="megarl-stream-reward")
        self.finished_at: list[float] = []  # per batch: monotonic time each agent loop returned
        self.scored_at: list[float] = []  # per batch: monotonic time each score came back

    def start_batch(self) -> None:
        self.finished_at, self.scored_at = [], []

    async def scored(self, run: Awaitable[AgentLoopOutput], sample: dict[str, Any]) -> tuple[AgentLoopOutput, tuple, Outcome]:
        """Await the agent loop ``run``, then score its trajectory; returns (output, row, outcome)."""
        out = await run
        ready_at = time.monotonic()
        self.finished_at.append(ready_at)
        key = self.manager.reward_fn_key
        if key not in sample:
            raise KeyError(f"data.reward_fn_key={key!r}: the batch has no such column (columns: {sorted(sample)})")
        text = self.manager.tokenizer.decode(out.response_ids[: self.response_length], skip_special_tokens=True)
        row = self.manager.row(sample[key], text, sample.get("reward_model"), sample.get("extra_info"))
        outcome = await asyncio.get_running_loop().run_in_executor(self.executor, self.manager.score_row, row, ready_at)
        self.scored_at.append(time.monotonic())
        return out, row, outcome

    def collect(self, batch: Any, rows: list[tuple], outcomes: list[Outcome]) -> tuple[torch.Tensor, dict[str, list[Any]], dict[str, float]]:
        """(token_level_scores ``[B, R]``, reward_extra_info, metrics) of ``batch`` (the rollout's DataProto,
        rows in the order of ``rows``). Metric ``reward/scored_during_rollout``: the fraction of samples
        whose score was back before the batch's last agent loop returned (the overlap streaming buys)."""
        scores, extra = self.manager.collect(batch, rows, outcomes)
        last = max(self.finished_at, default=0.0)
        overlap = sum(t < last for t in self.scored_at) / max(1, len(self.scored_at))
        return scores, extra, {"reward/scored_during_rollout": float(overlap)}

    def close(self) -> None:
        self.executor.shutdown(wait=False)
        self.manager.close()
