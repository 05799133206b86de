"""The async modes' sampler: admits prompts (admission control), hands them to the engines, forms
each step's batch from the groups the engines finished (megarl.trainer.v1.groups), and stamps the
batch with its staleness metrics.

One call per step, :meth:`AsyncSampler.next_batch`, in this order (the engines hold ``v = step - 1``):

1. ``drop``: groups that would exceed the bound at this step are evicted (cancelled on their engine);
2. admission: up to :func:`~megarl.trainer.v1.admission.admission_capacity` new prompts (evicted ones
   replaced), each to the replica of its place in its training batch (:func:`replica_of`), so every
   step's batch is spread evenly over the replicas whatever the admissions' sizes (an admission of
   several batches cut contiguously gave the first batch to the first replicas alone, which then
   generated while the others idled); with B divisible by the replicas and nothing in flight a step
   generates what ``sync`` generates;
3. generation until the batch is ready (colocated engines: until every replica finished its share,
   each generating its newer groups meanwhile, then what is unfinished is interrupted and resumes at
   the next step; standalone engines keep generating: this only collects what they finished), more
   admissions if evictions left it short;
4. the batch: the chosen groups' samples in admission order, as ``generate_sequences`` lays them out,
   with ``rollout_versions`` (the trainer logs their staleness, megarl.trainer.v1.staleness).
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any, Protocol

import numpy as np
import torch

from megarl.agent.batch import trajectories_to_batch
from megarl.config.schema.root import MegaRLConfig
from megarl.protocol import DataProto
from megarl.trainer.v1.admission import admission_capacity, staleness_bound
from megarl.trainer.v1.feed import PromptFeed
from megarl.trainer.v1.groups import Group, GroupBuffer
from megarl.trainer.v1.staleness import PREFIX


class Engines(Protocol):
    """The rollout replicas as the sampler drives them (megarl.trainer.v1.colocated_engines,
    megarl.trainer.v1.standalone_engines)."""

    replicas: int
    pad_token_id: int  # the rollout's response padding

    def submit(self, shares: list[tuple[DataProto, list[int]]]) -> None:
        """Per replica, its prompts and their group ids (every sample of a prompt is one group)."""

    def cancel(self, gids_by_replica: dict[int, list[int]]) -> None:
        """Stop generating these groups (evicted)."""

    def generate(self, version: int, targets: dict[int, tuple[list[int], int]]) -> tuple[dict[int, list], dict[str, float]]:
        """Generate with weights ``version``; returns the groups finished since the last call
        (gid -> samples) and metrics. ``targets``: per replica (gids, count), see GroupBuffer.targets."""


def replica_of(index: int, batch_size: int, replicas: int) -> int:
    """The replica that generates the prompt of admission ``index``: its place in its training batch
    (``index mod batch_size``, as trained under ``wait``) cut into ``replicas`` contiguous shares whose
    sizes differ by at most one (``call_rollout``'s equal chunks when ``replicas`` divides the batch)."""
    return (index % batch_size) * replicas // batch_size


class AsyncSampler:
    """Args: the run's config, the training loader, the engines."""

    def __init__(self, cfg: MegaRLConfig, loader: Any, engines: Engines) -> None:
        v1 = cfg.trainer.v1
        rollout = cfg.actor_rollout_ref.rollout
        self.batch_size = int(cfg.data.train_batch_size)
        self.warmup = v1.warmup_batches()
        self.buffer = GroupBuffer(self.batch_size, staleness_bound(v1.sampler.max_off_policy_threshold),
                                  v1.sampler.max_off_policy_strategy)
        self.feed = PromptFeed(loader)
        self.engines = engines
        self.n, self.response_length = int(rollout.n), int(rollout.response_length)
        self.do_sample = bool(rollout.do_sample)
        self.temperature = float(rollout.temperature) if self.do_sample else 1.0  # the log-probs' temperature
        self.with_log_probs = bool(rollout.calculate_log_probs)
        self.evicted = 0
        self._gids = itertools.count()

    # ------------------------------------------------------------------ checkpoints
    def state(self) -> dict[str, Any]:
        """Where a resumed run restarts admission (no admitted, untrained prompt is lost)."""
        live = self.buffer.live()
        return self.feed.resume_state(live[0].index if live else None)

    def load_state(self, state: dict[str, Any], step: int) -> None:
        """Resume after ``step`` trained steps: ``step * B`` prompts count as admitted."""
        self.feed.load_state(state, step * self.batch_size)

    # ------------------------------------------------------------------ one step
    def next_batch(self, step: int, metrics: dict[str, float]) -> DataProto:
        version = step - 1
        evicted = self.buffer.over_age(version)
        if evicted:
            self._evict(evicted)
        metrics[f"{PREFIX}evicted_samples"] = float(len(evicted) * self.n)
        self._admit(version)
        while True:
            finished, gen_metrics = self.engines.generate(version, self.buffer.targets())
            for gid, samples in finished.items():
                self.buffer.finish(gid, samples)
            metrics.update(gen_metrics)
            groups = self.buffer.take_batch()
            if groups is not None:
                break
            if not self._admit(version) and not any(not g.finished for g in self.buffer.groups.values()):
                raise RuntimeError(f"step {step}: {len(self.buffer.live())} groups left, fewer than a batch of "
                                   f"{self.batch_size}, and nothing is generating")
        metrics[f"{PREFIX}groups_in_flight"] = float(sum(not g.finished for g in self.buffer.groups.values()))
        return self._assemble(groups, step)

    def _evict(self, groups: list[Group]) -> None:
        by_replica: dict[int, list[int]] = {}
        for g in groups:
            if not g.finished:
                by_replica.setdefault(g.replica, []).append(g.gid)
        self.buffer.evict(groups)
        self.evicted += len(groups)
        if by_replica:
            self.engines.cancel(by_replica)

    def _admit(self, version: int) -> int:
        """Admit what the pacing allows; returns how many prompts were admitted."""
        k = admission_capacity(version, self.batch_size, self.warmup, self.feed.position, self.evicted)
        prompts = self.feed.take(k)
        if prompts is None:
            return 0
        first = self.feed.position - k
        prompts.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(k)], dtype=object)
        rows_of: list[list[int]] = [[] for _ in range(self.engines.replicas)]
        for row in range(k):
            rows_of[replica_of(first + row, self.batch_size, self.engines.replicas)].append(row)
        shares = []
        for replica, rows in enumerate(rows_of):
            gids = []
            for row in rows:
                group = Group(next(self._gids), first + row, replica, version, prompts[row:row + 1])
                self.buffer.add(group)
                gids.append(group.gid)
            shares.append((prompts[torch.tensor(rows, dtype=torch.long)], gids))
        self.engines.submit(shares)
        return k

    def _assemble(self, groups: list[Group], step: int) -> DataProto:
        prompts = DataProto.concat([g.prompt for g in groups])
        samples = [s for g in groups for s in g.trajectories]
        batch = trajectories_to_batch(prompts, samples, self.n, self.response_length, self.engines.pad_token_id,
                                      self.with_log_probs)
        agent_metrics = batch.meta_info.pop("metrics")
        batch.meta_info.update(global_step=step, policy_version=step - 1, temperature=self.temperature,
                               do_sample=self.do_sample, validate=False, metrics=agent_metrics)
        return batch
