"""The groups in flight and which of them a step trains (pure: no Ray, no engines).

A group is one prompt and its ``rollout.n`` samples, admitted in prompt order; its admission index
is its place in that order. Which groups form the step's batch (``max_off_policy_strategy``):

* ``wait``: the ``B`` oldest groups not yet trained, once all of them finished (the trainer waits
  for a slow one; nothing is discarded, and the admission pacing keeps every group within the bound);
* ``drop`` (verl): the ``B`` earliest-admitted FINISHED groups; a group that would exceed the bound
  (counted from its admission, as verl counts from submission) is evicted, whether finished or still
  generating, and a new prompt is admitted in its place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Group:
    """``index``: admission order; ``replica``: the engine generating it;
    ``admitted_version``: the engines' policy version when it was admitted; ``trajectories``: its
    samples (``AgentLoopOutput``) once finished."""

    gid: int
    index: int
    replica: int
    admitted_version: int
    prompt: Any  # DataProto, one row
    trajectories: list | None = None

    @property
    def finished(self) -> bool:
        return self.trajectories is not None


class GroupBuffer:
    """The admitted groups not yet trained or evicted.

    Args:
        batch_size: ``data.train_batch_size`` (groups per step).
        bound: the most versions a group may lag when trained (None: no bound).
        strategy: ``"wait"`` | ``"drop"``.
    """

    def __init__(self, batch_size: int, bound: int | None, strategy: str) -> None:
        if strategy not in ("wait", "drop"):
            raise ValueError(f"unknown max_off_policy_strategy {strategy!r}")
        self.batch_size, self.bound, self.strategy = batch_size, bound, strategy
        self.groups: dict[int, Group] = {}  # by gid

    def add(self, group: Group) -> None:
        self.groups[group.gid] = group

    def finish(self, gid: int, trajectories: list) -> None:
        """The samples of group ``gid`` (ignored when it was evicted meanwhile)."""
        group = self.groups.get(gid)
        if group is not None:
            group.trajectories = trajectories

    def live(self) -> list[Group]:
        """Trainable groups in admission order."""
        return sorted(self.groups.values(), key=lambda g: g.index)

    def over_age(self, trained_version: int) -> list[Group]:
        """``drop``: the groups that would lag more than the bound if trained at ``trained_version``."""
        if self.strategy != "drop" or self.bound is None:
            return []
        return [g for g in self.live() if trained_version - g.admitted_version > self.bound]

    def evict(self, groups: list[Group]) -> None:
        for g in groups:
            self.groups.pop(g.gid, None)

    def targets(self) -> dict[int, tuple[list[int], int]]:
        """Per replica, the groups the step waits for and how many of them must finish:
        ``wait``: its share of the ``B`` oldest groups, all of them; ``drop``: as many of its groups
        as it holds among the ``B`` oldest (any of them: the earliest admitted finished ones are trained)."""
        live = self.live()
        oldest = live[: self.batch_size]
        out: dict[int, tuple[list[int], int]] = {}
        for replica in sorted({g.replica for g in self.groups.values()}):
            share = [g.gid for g in oldest if g.replica == replica]
            if self.strategy == "wait":
                out[replica] = (share, len(share))
            else:
                out[replica] = ([g.gid for g in live if g.replica == replica], len(share))
        return out

    def take_batch(self) -> list[Group] | None:
        """The step's groups in admission order, removed from the buffer; None while not ready."""
        live = self.live()
        if self.strategy == "wait":
            chosen = live[: self.batch_size]
            if len(chosen) < self.batch_size or not all(g.finished for g in chosen):
                return None
        else:
            chosen = [g for g in live if g.finished][: self.batch_size]
            if len(chosen) < self.batch_size:
                return None
        for g in chosen:
            del self.groups[g.gid]
        return chosen
