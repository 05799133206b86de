"""The rollout TP mirror's protocol (megarl.workers.engine_mirror) on four gloo ranks, two TP = 2
replicas running different scripts: each follower's engine gets exactly its leader engine's calls
(adds, aborts, steps) in the leader's order, idle heartbeats keep it waiting without stepping, it
returns its leader's batch or raises its failure, and a silent leader ends the wait after the
timeout instead of hanging.

The engine here records calls (the four LLMEngine methods the mirror uses); the real vLLM engines
at rollout TP = 2 are tests/agent/test_agent_loops.py::test_tool_batch_at_rollout_tp2_equals_tp1.
"""

from __future__ import annotations

import random
import time

import pytest

from helpers.dist_utils import run_distributed

pytestmark = pytest.mark.slow

TIMEOUT_S = 2.0  # the channel's: heartbeats every 0.5 s


class Params:
    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens

    def clone(self) -> Params:
        return Params(self.max_tokens)


class RecordingEngine:
    """Records each call; a step finishes the oldest live request."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.live: list[str] = []

    def add_request(self, request_id, prompt, params) -> None:
        self.calls.append(("add", request_id, prompt, params.max_tokens))
        self.live.append(request_id)

    def abort_request(self, request_ids) -> None:
        self.calls.append(("abort", list(request_ids)))
        self.live = [r for r in self.live if r not in request_ids]

    def has_unfinished_requests(self) -> bool:
        return bool(self.live)

    def step(self) -> list[str]:
        self.calls.append(("step",))
        return [self.live.pop(0)]


def _lead(engine, rng: random.Random) -> None:
    """A jittery agent-loop-like batch: requests added in bursts, steps, idle spells (tools) longer
    than the timeout with the engine polled as AsyncEngine polls it, a mid-batch abort."""
    ids = iter(f"r{i}" for i in range(100))
    for burst in range(6):
        for _ in range(rng.randint(1, 3)):
            engine.add_request(next(ids), {"prompt_token_ids": [burst, rng.randint(0, 9)]}, Params(rng.randint(1, 8)))
        if burst == 2:
            engine.abort_request([engine.engine.live[-1]])
        while engine.has_unfinished_requests():
            engine.step()
        idle_until = time.monotonic() + (1.5 * TIMEOUT_S if burst == 3 else rng.uniform(0, 0.05))
        while time.monotonic() < idle_until:  # every sample in a tool
            assert not engine.has_unfinished_requests()
            time.sleep(0.01)


def _mirror_body() -> dict:
    import torch.distributed as dist

    from megarl.workers.engine_mirror import LeaderEngine, LeaderLostError, follow, rollout_tp_channel

    dist.init_process_group("gloo")
    channel = rollout_tp_channel(2, timeout_s=TIMEOUT_S)
    engine, out = RecordingEngine(), {"leads": channel.leads}
    if channel.leads:
        leader = LeaderEngine(engine, channel)
        _lead(leader, random.Random(channel.leader))
        leader.end_batch({"rows": [channel.leader]})
        out["batch_calls"] = list(engine.calls)
        # a failing batch: its request is aborted, then the failure is sent
        leader.add_request("bad", {"prompt_token_ids": [7]}, Params(2))
        leader.step()
        leader.abort_request(list(engine.live))
        leader.end_batch(failure="ValueError: boom")
        out["calls"] = engine.calls
        time.sleep(2.5 * TIMEOUT_S)  # a silent leader (hung): the follower must give up on its own
        return out
    out["result"] = follow(engine, channel)
    out["batch_calls"] = list(engine.calls)
    with pytest.raises(RuntimeError, match=f"rollout TP leader rank {channel.leader} failed this batch: ValueError: boom"):
        follow(engine, channel)
    out["calls"], out["live_after_failure"] = engine.calls, list(engine.live)
    start = time.monotonic()
    with pytest.raises(LeaderLostError, match=f"rollout TP rank {dist.get_rank()} lost its leader, rank {channel.leader}"):
        follow(engine, channel)
    out["silent_wait_s"] = time.monotonic() - start
    return out


def test_follower_repeats_the_leaders_calls_and_returns_its_batch():
    ranks = run_distributed(_mirror_body, 4, timeout=120)
    assert [r["leads"] for r in ranks] == [True, False, True, False]
    assert ranks[0]["batch_calls"] != ranks[2]["batch_calls"]  # the replicas' scripts differ
    for first in (0, 2):  # each replica: ranks first (leader) and first + 1
        leader, follower = ranks[first], ranks[first + 1]
        assert follower["result"] == {"rows": [first]}
        calls = leader["batch_calls"]
        assert calls.count(("step",)) >= 6 and any(c[0] == "abort" for c in calls)  # the script did what it says
        assert follower["batch_calls"] == calls  # same adds, aborts and steps, same order (no heartbeat stepped)
        assert follower["calls"] == leader["calls"] and follower["live_after_failure"] == []
        assert TIMEOUT_S <= follower["silent_wait_s"] < 2.5 * TIMEOUT_S
