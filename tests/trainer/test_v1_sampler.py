"""The async modes' sampler (megarl.trainer.v1) against a simulated engine: admission pacing,
batch selection by strategy, the staleness bound, partial rollout's per-token versions, resume.

The simulated engines generate one token per group per tick, every group of a replica at once;
prompts whose index is a multiple of 8 need 8x the tokens (a long tail). ``colocated`` engines run
until the step's groups are done, then stop (what is unfinished continues next step, under the new
version); ``standalone`` engines run a fixed number of ticks per poll whatever the trainer does. The
bound is checked on the batch's token versions here, not with the code's staleness metric.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from megarl.agent.base import AgentLoopOutput
from megarl.data.sampler import ResumableSampler, RLDataLoader
from megarl.protocol import DataProto
from megarl.trainer.v1.admission import admission_capacity, staleness_bound
from megarl.trainer.v1.feed import PromptFeed
from megarl.trainer.v1.sampler import AsyncSampler
from megarl.trainer.v1.staleness import staleness_metrics, trajectory_staleness

B, N, R, P = 4, 2, 16, 3
LONG, SHORT = 16, 2


def _collate(rows: list[dict]) -> DataProto:
    ids = torch.tensor([[1, 2, 3 + r["index"]] for r in rows])
    mask = torch.ones_like(ids)
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(-1) - 1},
                               {"extra_info": [{"index": r["index"]} for r in rows]})


def _loader(rows: int = 64, shuffle: bool = False) -> RLDataLoader:
    return RLDataLoader([{"index": i} for i in range(rows)], B, ResumableSampler(rows, shuffle, seed=5), _collate,
                        drop_last=True)


class SimEngines:
    def __init__(self, replicas: int, standalone: bool, ticks_per_poll: int = 3) -> None:
        self.replicas, self.standalone, self.ticks_per_poll = replicas, standalone, ticks_per_poll
        self.pad_token_id = 0
        self.groups: dict[int, dict] = {}  # gid -> {replica, need, prompt, versions}
        self.cancelled: list[int] = []
        self.targets: list[dict] = []  # per generate call: replica -> (gids, count)

    def submit(self, shares):
        for replica, (prompts, gids) in enumerate(shares):
            for row, gid in enumerate(gids):
                index = int(prompts.non_tensor_batch["extra_info"][row]["index"])
                self.groups[gid] = {"replica": replica, "need": LONG if index % 8 == 0 else SHORT,
                                    "prompt": prompts.batch["input_ids"][row].tolist(), "versions": []}

    def cancel(self, gids_by_replica):
        for gids in gids_by_replica.values():
            for gid in gids:
                self.cancelled.append(gid)
                self.groups.pop(gid)

    def _tick(self, version: int) -> None:
        for g in self.groups.values():
            if len(g["versions"]) < g["need"]:
                g["versions"].append(version)

    def generate(self, version, targets):
        self.targets.append(targets)
        if self.standalone:
            for _ in range(self.ticks_per_poll):
                self._tick(version)
        else:
            def met() -> bool:
                for gids, count in targets.values():
                    done = sum(g not in self.groups or self._done(g) for g in gids)
                    if done < count and done < len(gids):
                        return False
                return True

            while not met():
                self._tick(version)
        finished = {gid: g for gid, g in self.groups.items() if self._done(gid)}
        for gid in finished:
            del self.groups[gid]
        return {gid: [self._sample(g) for _ in range(N)] for gid, g in finished.items()}, {}

    def _done(self, gid: int) -> bool:
        g = self.groups[gid]
        return len(g["versions"]) >= g["need"]

    @staticmethod
    def _sample(g: dict) -> AgentLoopOutput:
        k = len(g["versions"])
        return AgentLoopOutput(g["prompt"], [7] * k, [1] * k, [-0.5] * k, num_turns=2, response_versions=list(g["versions"]))


def _cfg(threshold: int | None, strategy: str, warmup: float, mode: str = "colocate_async"):
    section = SimpleNamespace(num_warmup_batches=warmup)
    v1 = SimpleNamespace(trainer_mode=mode, colocate_async=section, separate_async=section,
                         sampler=SimpleNamespace(max_off_policy_threshold=threshold, max_off_policy_strategy=strategy))
    v1.warmup_batches = lambda: float(warmup)
    rollout = SimpleNamespace(n=N, response_length=R, temperature=1.0, do_sample=True, calculate_log_probs=True)
    return SimpleNamespace(data=SimpleNamespace(train_batch_size=B), trainer=SimpleNamespace(v1=v1),
                           actor_rollout_ref=SimpleNamespace(rollout=rollout))


def _run(sampler: AsyncSampler, steps: int, first: int = 1) -> list[tuple[DataProto, dict]]:
    out = []
    for step in range(first, first + steps):
        metrics: dict[str, float] = {}
        out.append((sampler.next_batch(step, metrics), metrics))
    return out


def _worst_lag(batches) -> int:
    return max(int(trajectory_staleness(b.batch["rollout_versions"], step - 1).max())
               for step, (b, _) in enumerate(batches, start=1))


@pytest.mark.parametrize("standalone", [False, True])
@pytest.mark.parametrize("replicas", [1, 3])
def test_threshold_one_without_warmup_is_the_sync_schedule(standalone, replicas):
    """Every step trains exactly the loader's next batch, in its order, generated by the trained version."""
    engines = SimEngines(replicas, standalone)
    batches = _run(AsyncSampler(_cfg(1, "drop", 0), _loader(), engines), 8)
    expected = [[int(r["index"]) for r in batch.non_tensor_batch["extra_info"]] for batch in _loader()][:8]
    for step, (batch, metrics) in enumerate(batches, start=1):
        rows = [int(e["index"]) for e in batch.non_tensor_batch["extra_info"]]
        assert rows == [i for i in expected[step - 1] for _ in range(N)]
        versions = batch.batch["rollout_versions"]
        assert ((versions == step - 1) | (versions == -1)).all()
        assert metrics["training/off_policy/evicted_samples"] == 0
    assert not engines.cancelled


@pytest.mark.parametrize("standalone", [False, True])
@pytest.mark.parametrize("strategy", ["wait", "drop"])
@pytest.mark.parametrize("threshold, warmup", [(2, 1), (3, 2), (3, 0.5)])
def test_no_trained_sample_exceeds_the_bound(standalone, strategy, threshold, warmup):
    engines = SimEngines(2, standalone)
    batches = _run(AsyncSampler(_cfg(threshold, strategy, warmup), _loader(256, shuffle=True), engines), 30)
    assert _worst_lag(batches) <= threshold - 1
    assert _worst_lag(batches) >= 1  # the long tail is trained off-policy: the check is not vacuous
    resumed = [v for b, _ in batches for v in b.batch["rollout_versions"].unique().tolist()]
    assert len(set(resumed)) > 2
    evicted = sum(m["training/off_policy/evicted_samples"] for _, m in batches)
    if strategy == "wait":  # oldest first, waiting: every admitted prompt is trained, in order
        assert evicted == 0 and not engines.cancelled
        trained = [int(e["index"]) for b, _ in batches for e in b.non_tensor_batch["extra_info"][::N]]
        admitted = [int(e["index"]) for b in _loader(256, shuffle=True) for e in b.non_tensor_batch["extra_info"]]
        assert trained == admitted[: len(trained)]


@pytest.mark.parametrize("replicas, warmup", [(2, 2), (2, 0.5), (3, 1)])
def test_every_step_waits_on_every_replica_for_an_equal_share(replicas, warmup):
    """The first admission holds 1 + warmup batches: cut into contiguous shares it gave step 1's whole
    batch to the first replica(s), the others idle in that step (4 x H200, 2026-11-28: colocate_async
    0.88x sync, the slowest replica's engine time 2.6x the mean). Each replica must hold its share
    (floor or ceil of B / replicas) of every step's batch."""
    engines = SimEngines(replicas, standalone=False)
    _run(AsyncSampler(_cfg(3, "wait", warmup), _loader(256, shuffle=True), engines), 12)
    shares = sorted(B * (r + 1) // replicas - B * r // replicas for r in range(replicas))
    for targets in engines.targets:
        counts = sorted(targets.get(r, ([], 0))[1] for r in range(replicas))
        assert counts == shares, engines.targets


def test_drop_evicts_what_wait_waits_for():
    """verl's drop: the long groups fall behind and are evicted and replaced; wait trains them."""
    long_trained = {}
    for strategy in ("wait", "drop"):
        engines = SimEngines(1, standalone=True, ticks_per_poll=1)
        batches = _run(AsyncSampler(_cfg(2, strategy, 1), _loader(256, shuffle=True), engines), 30)
        lengths = [int(b.batch["response_mask"].sum(-1).max()) for b, _ in batches]
        long_trained[strategy] = sum(length == LONG for length in lengths)
        evicted = sum(m["training/off_policy/evicted_samples"] for _, m in batches)
        assert (evicted > 0) == (strategy == "drop")
    assert long_trained["drop"] < long_trained["wait"]


def test_pacing_beyond_the_bound_is_caught():
    """The check above can fail: admitting further ahead than the threshold allows (what the config
    rules refuse) trains samples older than the bound."""
    engines = SimEngines(1, standalone=False)
    batches = _run(AsyncSampler(_cfg(2, "wait", 3), _loader(256, shuffle=True), engines), 20)
    assert _worst_lag(batches) > 1


def test_null_threshold_never_evicts():
    engines = SimEngines(1, standalone=True, ticks_per_poll=1)
    batches = _run(AsyncSampler(_cfg(None, "drop", 2), _loader(256, shuffle=True), engines), 20)
    assert sum(m["training/off_policy/evicted_samples"] for _, m in batches) == 0


def test_resume_restarts_at_the_oldest_untrained_prompt():
    engines = SimEngines(1, standalone=False)
    sampler = AsyncSampler(_cfg(3, "wait", 2), _loader(64, shuffle=True), engines)
    _run(sampler, 5)
    state = sampler.state()
    rest = [b for b, _ in _run(sampler, 3, first=6)]
    resumed = AsyncSampler(_cfg(3, "wait", 2), _loader(64, shuffle=True), SimEngines(1, standalone=False))
    resumed.load_state(state, 5)
    again = [b for b, _ in _run(resumed, 3, first=6)]

    def rows(b):
        return [int(e["index"]) for e in b.non_tensor_batch["extra_info"]]

    assert [rows(b) for b in again] == [rows(b) for b in rest]


def test_admission_capacity_is_verls_feed():
    # step 1 (version 0) with one warm-up batch: 2B; then B per version; evictions are replaced
    assert admission_capacity(0, 4, 1, 0, 0) == 8
    assert admission_capacity(1, 4, 1, 8, 0) == 4
    assert admission_capacity(1, 4, 1, 8, 3) == 7
    assert admission_capacity(0, 4, 0.5, 0, 0) == 6  # fractional warm-up: whole prompts
    assert admission_capacity(3, 4, 0, 20, 0) == 0
    assert staleness_bound(1) == 0 and staleness_bound(8) == 7 and staleness_bound(None) is None


def test_staleness_metrics_by_hand():
    # rows: all from version 4 | resumed 2 -> 4 | a tool turn (-1) between versions 3 and 4 | nothing generated
    versions = torch.tensor([[4, 4, 4, -1], [2, 2, 4, 4], [3, -1, -1, 4], [-1, -1, -1, -1]])
    m = staleness_metrics(versions, trained_version=4)
    assert trajectory_staleness(versions, 4).tolist() == [0, 2, 1, 0]
    assert m["training/off_policy/staleness_hist/0"] == 2
    assert m["training/off_policy/staleness_hist/2"] == 1 and m["training/off_policy/staleness_hist/1"] == 1
    assert m["training/off_policy/staleness_max"] == 2
    assert m["training/off_policy/off_policy_token_fraction"] == pytest.approx(3 / 9)  # tokens 2, 2, 3 of 9
    assert m["training/off_policy/policy_lag_mean"] == pytest.approx((2 + 2 + 1) / 9)


def test_feed_resume_state_skips_what_was_admitted_before_the_oldest_untrained():
    feed = PromptFeed(_loader(10, shuffle=True))
    taken = [int(e["index"]) for k in (3, 2, 4, 1, 5) for e in feed.take(k).non_tensor_batch["extra_info"]]
    state = feed.resume_state(6)
    again = PromptFeed(_loader(10, shuffle=True))
    again.load_state(state, 6)
    assert [int(e["index"]) for e in again.take(9).non_tensor_batch["extra_info"]] == taken[6:15]
    assert math.isclose(feed.position, 15)
