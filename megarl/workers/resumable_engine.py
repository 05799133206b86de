"""Partial rollout: requests that survive a weight update.

:class:`ResumableEngine` is the agent loops' engine in the async trainer modes. A request runs in
segments: :meth:`ResumableEngine.pause` aborts every request in flight (before the weights change),
keeping the tokens and log-probs sampled so far; after :meth:`ResumableEngine.resume` each interrupted
``generate`` continues with a new request of prompt + its tokens so far (re-prefilled under the new
weights) for the rest of its ``max_tokens``. The agent loop sees one response (verl's
``FullyAsyncLLMServerClient``). Every token carries the version of the weights that sampled it:
the engine steps and the weight loads never overlap, so a step's tokens come from one version.

The in-process ``LLMEngine`` emits nothing for an aborted request, so outputs are taken as they are
made (``RequestOutputKind.DELTA``: each step returns the new tokens and their log-probs), which
samples exactly as ``FINAL_ONLY`` does.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Sequence

from megarl.agent.base import TokenOutput
from megarl.workers.async_engine import AsyncEngine


@dataclass
class _Segment:
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)


class ResumableEngine(AsyncEngine):
    """An :class:`AsyncEngine` whose requests are paused and resumed across weight updates.

    Every call runs on the thread of the event loop that drives it."""

    def __init__(self, llm_engine: Any) -> None:
        super().__init__(llm_engine)
        self._segments: dict[str, _Segment] = {}
        self._running = asyncio.Event()
        self._running.set()

    async def generate(self, prompt_ids: Sequence[int], params: Any) -> TokenOutput:
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        if params.n != 1:
            raise ValueError(f"ResumableEngine.generate samples one response per request, got n={params.n}")
        done = _Segment()
        budget = int(params.max_tokens)
        while True:
            await self._running.wait()
            segment_params = params.clone()
            segment_params.output_kind = RequestOutputKind.DELTA
            segment_params.max_tokens = budget - len(done.tokens)
            request_id = f"megarl-{next(self._ids)}"
            future: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
            self._pending[request_id] = future
            self._segments[request_id] = segment = _Segment()
            self._note_version()
            self.engine.add_request(request_id, TokensPrompt(prompt_token_ids=[*prompt_ids, *done.tokens]), segment_params)
            try:
                finish_reason = await future
            except asyncio.CancelledError:  # the group was evicted
                if self._pending.pop(request_id, None) is not None:
                    self.engine.abort_request([request_id])
                self._segments.pop(request_id, None)
                raise
            done.tokens += segment.tokens
            done.log_probs += segment.log_probs
            done.versions += segment.versions
            if finish_reason != "abort":
                return TokenOutput(done.tokens, done.log_probs, finish_reason, versions=done.versions)
            if len(done.tokens) >= budget:
                return TokenOutput(done.tokens, done.log_probs, "length", versions=done.versions)

    def _deliver(self, outputs: list[Any]) -> None:
        for output in outputs:
            segment = self._segments.get(output.request_id)
            if segment is None:
                continue
            completion = output.outputs[0]
            tokens = list(completion.token_ids)
            segment.tokens += tokens
            if completion.logprobs is not None:
                segment.log_probs += [step[tok].logprob for step, tok in zip(completion.logprobs, tokens)]
            segment.versions += [self.version] * len(tokens)
            if output.finished:
                del self._segments[output.request_id]
                future = self._pending.pop(output.request_id)
                if not future.done():
                    future.set_result(completion.finish_reason)

    def pause(self) -> int:
        """Abort every request in flight, keeping what it sampled; returns how many were interrupted.
        Their ``generate`` calls continue after :meth:`resume`."""
        self._running.clear()
        interrupted = list(self._pending)
        if interrupted:
            self.engine.abort_request(interrupted)
        for request_id in interrupted:
            self._segments.pop(request_id, None)  # generate already holds it
            future = self._pending.pop(request_id)
            if not future.done():
                future.set_result("abort")
        return len(interrupted)

    def resume(self) -> None:
        self._running.set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()
