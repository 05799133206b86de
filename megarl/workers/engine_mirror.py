"""Agent loops at ``rollout.tensor_model_parallel_size > 1``: the TP group's first rank decides the
engine's operations, the other ranks repeat them.

Why: with TP > 1 every rank of a rollout replica runs its own vLLM ``LLMEngine`` (the
``external_launcher`` executor is SPMD: no engine process, each rank schedules for itself). The
ranks stay in lockstep (same requests in the same batches, so the model's TP collectives match)
only if they add and abort the same requests in the same order between the same ``step`` calls.
Agent loops cannot promise that: a sample's next turn is added when its tool thread, timeout or
interaction returns, which each rank's clock decides, so the ranks would add the same batch in
different orders (a hang in the TP all-reduce, or wrong tokens).

How: the leader (the group's first rank) runs the agent loops exactly as at TP = 1, on a
:class:`LeaderEngine`, which records each ``add_request`` / ``abort_request`` and broadcasts them
before each ``step`` (one message: the operations since the last one, then "step"). The other
ranks run :func:`follow`: apply each message's operations to their own engine in the same order,
step when the leader steps, until the leader's end-of-batch message, which carries the leader's
finished batch (every rank returns the same rows) or its error. Messages go over a CPU (gloo)
group of the TP group's ranks (:func:`rollout_tp_channel`); at TP = 1 none of this exists.

Every wait is bounded: while the leader has nothing to step (its samples are in tools) it sends a
heartbeat every ``heartbeat_s``; a follower that hears nothing for the group's timeout, or loses
the connection (the leader died), raises :class:`LeaderLostError` naming the leader.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch.distributed as dist

LEADER_TIMEOUT_S = 600.0  # a follower's longest wait for its leader's next message (verl's nccl_timeout default)
HEARTBEAT_S = 1.0  # an idle leader tells its followers it is alive this often


class LeaderLostError(RuntimeError):
    """A follower heard nothing from its rollout TP leader in time, or lost the connection to it."""


@dataclass
class Message:
    """What a leader sends: ``ops`` in the order it made them, ``("add", request_id, prompt, params)``
    or ``("abort", request_ids)``; then ``step`` (the leader steps its engine now), or ``end`` (the
    batch is over: ``result`` is the leader's batch, ``failure`` its error text when it failed)."""

    ops: list[tuple] = field(default_factory=list)
    step: bool = False
    end: bool = False
    result: Any = None
    failure: str | None = None


class Channel:
    """One rollout TP group's broadcast channel: ``group`` (gloo, over the group's ranks; its timeout
    bounds every wait), ``leader`` (the global rank that sends)."""

    def __init__(self, group: Any, leader: int, timeout_s: float) -> None:
        self.group, self.leader, self.timeout_s = group, leader, timeout_s
        self.heartbeat_s = min(HEARTBEAT_S, timeout_s / 4)
        self.leads = dist.get_rank() == leader

    def send(self, message: Message) -> None:
        dist.broadcast_object_list([message], src=self.leader, group=self.group)

    def receive(self) -> Message:
        box: list[Any] = [None]
        try:
            dist.broadcast_object_list(box, src=self.leader, group=self.group)
        except RuntimeError as exc:  # gloo: a timeout, or the leader's connection closed
            raise LeaderLostError(
                f"rollout TP rank {dist.get_rank()} lost its leader, rank {self.leader} (nothing within "
                f"{self.timeout_s:g}s, or it died; its log says why): {exc}") from exc
        return box[0]


def rollout_tp_channel(tp: int, timeout_s: float = LEADER_TIMEOUT_S) -> Channel:
    """This rank's channel: its rollout TP group is ranks ``r*tp .. r*tp+tp-1`` (the replicas of
    :class:`RolloutWorker`), led by ``r*tp``. Collective over the world: every rank calls it once, at
    the same point (each group is created on every rank)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    ranks = [list(range(first, first + tp)) for first in range(0, world, tp)]
    group, _ = dist.new_subgroups_by_enumeration(ranks, timeout=timedelta(seconds=timeout_s), backend="gloo")
    return Channel(group, rank - rank % tp, timeout_s)


class LeaderEngine:
    """The leader's engine as :class:`~megarl.workers.async_engine.AsyncEngine` drives it: ``engine``'s
    calls, each operation recorded and broadcast on ``channel`` before the next step."""

    def __init__(self, engine: Any, channel: Channel) -> None:
        self.engine, self.channel = engine, channel
        self._ops: list[tuple] = []
        self._sent_at = time.monotonic()

    def add_request(self, request_id: str, prompt: Any, params: Any) -> None:
        self._ops.append(("add", request_id, prompt, params.clone()))  # as given: vLLM may normalise params in place
        self.engine.add_request(request_id, prompt, params)

    def abort_request(self, request_ids: list[str]) -> None:
        self._ops.append(("abort", list(request_ids)))
        self.engine.abort_request(request_ids)

    def has_unfinished_requests(self) -> bool:
        """The engine's answer; when it is False (the samples are in tools) a heartbeat is due now and then."""
        busy = self.engine.has_unfinished_requests()
        if not busy and time.monotonic() - self._sent_at > self.channel.heartbeat_s:
            self._send(Message())
        return busy

    def step(self) -> list[Any]:
        self._send(Message(step=True))
        return self.engine.step()

    def end_batch(self, result: Any = None, failure: str | None = None) -> None:
        """Release the followers: the last operations (aborts), then ``result`` or ``failure``."""
        self._send(Message(end=True, result=result, failure=failure))

    def _send(self, message: Message) -> None:
        message.ops, self._ops = self._ops, []
        self.channel.send(message)
        self._sent_at = time.monotonic()


def follow(engine: Any, channel: Channel) -> Any:
    """A follower's batch: apply the leader's operations to ``engine`` in its order and step when it
    steps, until its end-of-batch message; returns the leader's result (raises its failure)."""
    while True:
        message = channel.receive()
        for op in message.ops:
            if op[0] == "add":
                engine.add_request(*op[1:])
            else:
                engine.abort_request(op[1])
        if message.end:
            if message.failure is not None:
                raise RuntimeError(f"rollout TP leader rank {channel.leader} failed this batch: {message.failure}")
            return message.result
        if message.step:
            engine.step()
