"""One tool call, bounded: lifecycle in its own thread, a timeout, truncated text.

Each call runs the tool's ``create -> execute -> calc_reward -> release`` on a fresh event
loop in a daemon thread, and the agent waits at most ``rollout.multi_turn.tool_timeout_s``
for it. So a tool that raises, blocks its thread (``time.sleep``, a hung socket) or never
returns becomes an error observation after the timeout and cannot hang the step (a thread
still blocked is abandoned; it holds no engine state). Consequence for tool authors: a
call's coroutines run on their own event loop, so do not share loop-bound objects (an
aiohttp session) between calls.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, TypeVar

from megarl.agent.tools import BaseTool

T = TypeVar("T")


@dataclass
class CallResult:
    """``text``: the observation (already truncated); ``reward``: execute's step reward plus
    calc_reward's; ``error``: the call failed (raised, timed out, unknown tool); ``seconds``: wall time."""

    text: str
    reward: float
    error: bool
    seconds: float


def truncate(text: str, limit: int, side: str) -> str:
    """``text`` cut to ``limit`` characters (verl's markers): ``left`` keeps the end, ``right`` the
    start, ``middle`` both ends."""
    if len(text) <= limit:
        return text
    if side == "left":
        return "(truncated)..." + text[-limit:]
    if side == "right":
        return text[:limit] + "...(truncated)"
    half = limit // 2
    return text[:half] + "...(truncated)..." + text[-half:]


async def _lifecycle(tool: BaseTool, arguments: dict[str, Any], kwargs: dict[str, Any]) -> tuple[str, float]:
    instance_id, _ = await tool.create(create_kwargs=kwargs.get("create_kwargs", {}))
    try:
        response, step_reward, _ = await tool.execute(instance_id, arguments)
        reward = float(step_reward or 0.0) + float(
            await tool.calc_reward(instance_id, **kwargs.get("calc_reward_kwargs", {})) or 0.0)
    finally:
        await tool.release(instance_id, **kwargs.get("release_kwargs", {}))
    return (response.text or ""), reward


async def run_bounded(make_coroutine: Callable[[], Awaitable[T]], timeout_s: float, name: str) -> T:
    """The result of ``make_coroutine()`` run on a fresh event loop in a daemon thread, awaited for at
    most ``timeout_s`` (``asyncio.TimeoutError`` after it; the coroutine's exception as raised)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, failed: bool) -> None:
        if not done.done():
            (done.set_exception if failed else done.set_result)(result)

    def body() -> None:
        try:
            outcome, failed = asyncio.run(make_coroutine()), False
        except BaseException as exc:  # the callee's fault, re-raised in the caller's loop
            outcome, failed = exc, True
        try:
            loop.call_soon_threadsafe(settle, outcome, failed)
        except RuntimeError:  # the rollout's loop is gone: this call had timed out
            pass

    threading.Thread(target=body, name=f"megarl-{name}", daemon=True).start()
    return await asyncio.wait_for(done, timeout_s)


async def call_tool(tool: BaseTool, arguments: dict[str, Any], kwargs: dict[str, Any], *, timeout_s: float,
                    max_chars: int, truncate_side: str) -> CallResult:
    """Run one call of ``tool`` (see the module docstring); never raises for the tool's faults."""
    start = time.perf_counter()
    try:
        text, reward = await run_bounded(lambda: _lifecycle(tool, arguments, kwargs), timeout_s, f"tool-{tool.name}")
        error = False
    except asyncio.TimeoutError:
        text, reward, error = f"Error: tool '{tool.name}' timed out after {timeout_s:g}s", 0.0, True
    except Exception as exc:
        text, reward, error = f"Error executing tool '{tool.name}': {type(exc).__name__}: {exc}", 0.0, True
    return CallResult(truncate(text, max_chars, truncate_side), reward, error, time.perf_counter() - start)
