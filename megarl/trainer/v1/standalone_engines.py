"""separate_async's engines: one vLLM engine per GPU of their own pool
(``actor_rollout_ref.rollout.nnodes`` x ``n_gpus_per_node``), generating while the trainer trains.

Built after the trainer's groups: the engines (megarl.workers.engine_worker, threaded Ray actors, each
seeing only its GPU), then the weight-push group between the trainer's rank 0 and every engine
(megarl.weight_sync.sync_group: NCCL on GPU, gloo on CPU) with the trainer's resharding plan.

Faults: every wait on an engine is bounded, and an engine whose process died is named (group
``rollout_engine``, rank, pid, node) by the call that finds it: the run stops there. A push waits on
the engines first, so a dead engine is named even when the trainer's rank 0 would wait for it.
"""

from __future__ import annotations

import ray

from megarl.config.schema.root import MegaRLConfig
from megarl.parallel.layout import ParallelLayout
from megarl.protocol import DataProto
from megarl.trainer.metrics import mean_metrics
from megarl.trainer.resources import ResourcePool, create_resource_pool
from megarl.trainer.worker_group import WorkerError, WorkerGroup

ENGINE_CLS = "megarl.workers.engine_worker:EngineWorker"
PUSH_TIMEOUT_S = 1800.0  # one weight push (the group's collectives time out at the same bound)
COLLECT_WAIT_S = 0.25  # a collect returns after this long when nothing finished
CALL_TIMEOUT_S = 600.0  # any other call on an engine
ENGINE_CONCURRENCY = 4  # calls an engine serves at once (a collect while a validation batch runs)


class StandaloneEngines:
    """The sampler's engines (megarl.trainer.v1.sampler.Engines) for separate_async.

    Args:
        cfg: the run's config.
        actor: the trainer's actor group (megarl.workers.split_actor), the push's source.
        device: ``"cuda"`` | ``"cpu"``.
        env: the workers' environment.
    """

    def __init__(self, cfg: MegaRLConfig, actor: WorkerGroup, device: str, env: dict[str, str]) -> None:
        rollout = cfg.actor_rollout_ref.rollout
        use_gpu = device == "cuda"
        self.pool: ResourcePool = create_resource_pool(
            int(rollout.nnodes), int(rollout.n_gpus_per_node), use_gpu, 1.0 if use_gpu else 0.5,
            prefix="actor_rollout_ref.rollout")
        self.replicas = self.pool.world_size
        self.actor = actor
        self.backend = "nccl" if use_gpu else "gloo"
        self.group = WorkerGroup("rollout_engine", ENGINE_CLS, (cfg.actor_rollout_ref,), {"device": device},
                                 self.pool.placements, self.pool.cpus_per_slot, 1.0 if use_gpu else 0.0, env,
                                 rollout_layout=ParallelLayout(world_size=self.replicas),
                                 max_concurrency=ENGINE_CONCURRENCY, isolate_gpus=True)
        self.version = -1  # the policy version the engines hold (none until the first push)

    def init(self) -> None:
        """Start the engines and the weight-push group (collective: the trainer's rank 0 and every engine)."""
        self.group.call_all_within(CALL_TIMEOUT_S, "init_model")
        self.pad_token_id = self.group.call_all_within(CALL_TIMEOUT_S, "pad_token_id")[0]
        dtype = self.group.call_all_within(CALL_TIMEOUT_S, "engine_dtype")[0]
        plan = self.actor.call_all("weight_push_plan", dtype)[0]
        host, port = ray.get(self.actor.hosts[0].address.remote("weight_push"))
        size = self.replicas + 1
        trainer = self.actor.start_all("join_weight_push", host, port, size, self.backend, PUSH_TIMEOUT_S)
        engines = [h.call.remote("join_weight_push", host, port, rank + 1, size, self.backend, PUSH_TIMEOUT_S, plan)
                   for rank, h in enumerate(self.group.hosts)]
        self.group.wait_all(engines, "join_weight_push", CALL_TIMEOUT_S)
        self.actor.wait_all(trainer, "join_weight_push", CALL_TIMEOUT_S)

    # ------------------------------------------------------------------ the sampler's engines
    def submit(self, shares: list[tuple[DataProto, list[int]]]) -> None:
        refs = [h.call.remote("submit_groups", *shares[rank]) for rank, h in enumerate(self.group.hosts)]
        self.group.wait_all(refs, "submit_groups", CALL_TIMEOUT_S)

    def cancel(self, gids_by_replica: dict[int, list[int]]) -> None:
        refs = [h.call.remote("cancel_groups", gids_by_replica.get(rank, [])) for rank, h in enumerate(self.group.hosts)]
        self.group.wait_all(refs, "cancel_groups", CALL_TIMEOUT_S)

    def generate(self, version: int, targets: dict[int, tuple[list[int], int]]) -> tuple[dict[int, list], dict[str, float]]:
        """The groups finished since the last call (the engines generate all along)."""
        results = self.group.call_all_within(CALL_TIMEOUT_S, "collect", COLLECT_WAIT_S)
        finished: dict[int, list] = {}
        for result in results:
            finished.update(result["groups"])
        return finished, mean_metrics([r["metrics"] for r in results])

    # ------------------------------------------------------------------ weights and validation
    def push_weights(self, version: int) -> dict[str, float]:
        """The actor's weights as policy ``version`` into every engine, unless they hold it already:
        the engines interrupt what they generate, load in place, resume (megarl.workers.engine_worker)."""
        if version == self.version:
            return {}
        engines = self.group.start_all("receive_weights", version)
        trainer = self.actor.start_all("send_weights")
        try:
            received = self.group.wait_all(engines, "receive_weights", PUSH_TIMEOUT_S)
        except WorkerError as engine_error:
            if not engine_error.died:  # an engine's error may come from the sender's failure: name that first
                self.actor.wait_all(trainer, "send_weights", 30.0)
            raise
        sent = self.actor.wait_all(trainer, "send_weights", PUSH_TIMEOUT_S)
        self.version = version
        metrics = mean_metrics(received)
        metrics.update({f"{k}_sender": v for k, v in sent[0].items() if k.endswith(("seconds", "gb_per_s"))})
        return metrics

    def validate(self, prompts: DataProto, do_sample: bool) -> DataProto:
        return self.group.call_rollout("validate_sequences", prompts, do_sample=do_sample)

    def close(self, graceful: bool, shutdown_timeout_s: float) -> None:
        """``graceful``: the engines shut down first (at most ``shutdown_timeout_s``); then their
        processes and pool are released."""
        if graceful:
            try:
                self.group.call_all_within(shutdown_timeout_s, "shutdown")
            except Exception as error:
                print(f"[megarl] rollout_engine.shutdown: {error}", flush=True)
        self.group.shutdown()
        self.pool.release()

