"""colocate_async's engines: the colocated workers' vLLM replicas, time-sliced with training.

Each generation phase first syncs the actor's weights into them (the colocated sync, unchanged), then
runs every replica's groups until every replica finished its share of the step's batch
(megarl.workers.phase_end), interrupts the rest (partial rollout) and lets the engines sleep while the
trainer trains; the interrupted requests
continue, under the new weights, in the next step's generation phase (megarl.workers.hybrid
``advance``).
"""

from __future__ import annotations

from megarl.protocol import DataProto
from megarl.trainer.metrics import generation_metrics
from megarl.trainer.worker_group import WorkerGroup


class ColocatedEngines:
    """The sampler's engines (megarl.trainer.v1.sampler.Engines) on the actor group's replicas."""

    def __init__(self, actor: WorkerGroup) -> None:
        self.actor = actor
        self.replicas = actor.rollout_layout.dp
        self.pad_token_id = actor.call_all("pad_token_id")[0]  # the batch layout's response padding

    def submit(self, shares: list[tuple[DataProto, list[int]]]) -> None:
        self.actor.call_replicas("submit_groups", shares)

    def cancel(self, gids_by_replica: dict[int, list[int]]) -> None:
        self.actor.call_replicas("cancel_groups", [(gids_by_replica.get(r, []),) for r in range(self.replicas)])

    def generate(self, version: int, targets: dict[int, tuple[list[int], int]]) -> tuple[dict[int, list], dict[str, float]]:
        results = self.actor.call_replicas("advance", [(version, *targets.get(r, ([], 0))) for r in range(self.replicas)])
        finished: dict[int, list] = {}
        for result in results:
            finished.update(result["groups"])
        metrics = generation_metrics([r["metrics"] for r in results])
        metrics["rollout/interrupted_requests"] = float(sum(r["interrupted"] for r in results))
        return finished, metrics
