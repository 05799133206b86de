"""The colocated worker: Megatron actor (+ reference) and a vLLM rollout engine per rank.

One :class:`ActorRolloutRefWorker` per rank of the Megatron world (SPMD); the trainer
calls every method on every rank.

Dispatch the trainer must use (W = world size, t = ``rollout.tensor_model_parallel_size``):

* ``generate_sequences``: split across the W / t rollout replicas. Replica ``r`` is
  ranks ``r*t .. r*t+t-1`` (the DP groups of ``ParallelLayout(W, tp=t)``); every rank of
  a replica gets the SAME chunk ``r`` of the prompt batch (pad the batch to a multiple of
  W / t, ``DataProto.pad_to_divisor``); collect the output of the first rank of each
  replica and concatenate in replica order. With t = 1 every rank is a replica.
  The weight sync inside it is collective over the whole world: every rank must call
  ``generate_sequences`` once per step, even with an empty-looking share (give it a
  padded chunk).
* ``compute_log_prob`` / ``compute_ref_log_prob`` / ``update_actor``: split by
  Megatron data-parallel rank (every TP/PP/CP rank of a DP group gets the same slice);
  outputs are identical on all ranks of a DP group (the actor broadcasts from the
  last pipeline stage), collect from any, e.g. TP rank 0 of the last stage.
* ``save_checkpoint`` / ``load_checkpoint`` / ``init_model``: all ranks, same args.

Weights: ``update_actor`` and ``load_checkpoint`` mark the actor's weights as changed;
the next ``generate_sequences`` first syncs them into vLLM
(:class:`megarl.weight_sync.colocated.ColocatedSync`: the hand-over of the GPU between
Megatron and vLLM, and the load itself, shard to shard where the layouts match) and returns
the sync metrics in its ``meta_info["metrics"]``. The engine sleeps after each generation.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from megarl.config.schema.actor import ActorRolloutRefConfig
from megarl.config.schema.algorithm import RolloutCorrectionConfig
from megarl.protocol import DataProto
from megarl.utils.gpu_memory import phase_memory
from megarl.weight_sync import log_prob_gap

if TYPE_CHECKING:
    from megarl.config.schema.distillation import DistillationConfig
    from megarl.reward.managers import RewardSpec
    from megarl.weight_sync.colocated import ColocatedSync

ROLES = ("actor_rollout_ref", "actor_rollout")


class ActorRolloutRefWorker:
    """Actor + optional reference + rollout in one process.

    Args:
        config: the typed ``actor_rollout_ref`` section.
        role: ``"actor_rollout_ref"`` builds the reference model (the trainer uses it
            when ``actor.use_kl_loss`` or ``algorithm.use_kl_in_reward``);
            ``"actor_rollout"`` does not.
        device: ``"cpu"`` | ``"cuda"``; default cuda when available.
        rollout_correction: ``algorithm.rollout_correction``, for the actor's
            ``policy_loss.loss_mode=bypass_mode`` (see :class:`ActorWorker`).
        reward: the reward spec when training samples are scored in the agent loop as they finish
            (``reward.launch_reward_fn_async`` with ``rollout.mode=async``; see RolloutWorker).
        distillation: the ``distillation`` section when enabled (the actor's loss reads it; see
            :class:`ActorWorker`); None otherwise.
    """

    def __init__(
        self,
        config: ActorRolloutRefConfig,
        role: str = "actor_rollout_ref",
        device: str | None = None,
        rollout_correction: RolloutCorrectionConfig | None = None,
        reward: RewardSpec | None = None,
        distillation: DistillationConfig | None = None,
    ) -> None:
        if role not in ROLES:
            raise ValueError(f"ActorRolloutRefWorker role must be one of {ROLES}, got {role!r}")
        if role == "actor_rollout" and bool(config.actor.use_kl_loss):
            raise ValueError(
                "actor_rollout_ref.actor.use_kl_loss=true needs the reference model: "
                "use role='actor_rollout_ref'"
            )
        from megarl.workers.actor import ActorWorker

        self.config = config
        self.role = role
        self.device = device
        self.actor = ActorWorker(config, role="actor", device=device, rollout_correction=rollout_correction,
                                 distillation=distillation)
        # With LoRA the reference is the actor's base model (adapters off): no second model.
        want_ref = role == "actor_rollout_ref" and not self.actor.uses_lora
        self.ref = ActorWorker(config, role="ref", device=device) if want_ref else None
        self.rollout = None
        self.session = None  # the async trainer modes' groups (megarl.workers.rollout_session)
        self.phase_end = None  # their generation phases' common end (megarl.workers.phase_end)
        self.reward = reward
        self.weight_sync: ColocatedSync | None = None
        sync_cfg = config.rollout.weight_sync
        bucket_mb = float(sync_cfg.bucket_size_mb)
        if bucket_mb <= 0:
            raise ValueError(
                f"actor_rollout_ref.rollout.weight_sync.bucket_size_mb must be > 0, got {bucket_mb}"
            )
        self.bucket_size_bytes = int(bucket_mb * 2**20)
        self.integrity_check = bool(sync_cfg.integrity_check)

    # ------------------------------------------------------------------ setup
    def init_model(self) -> None:
        """Megatron models (process groups first; each leaves its configured state offloaded),
        then the vLLM engine (joins that world, sizes its KV cache in the memory they left) and
        the weight sync. The engine has dummy weights until the first sync and sleeps until
        then (``rollout.free_cache_engine``), so a checkpoint load or an update may come first."""
        from megarl.weight_sync.colocated import ColocatedSync
        from megarl.workers.rollout import RolloutWorker

        self.actor.init_model()
        if self.ref is not None:
            self.ref.init_model()
        # Level 2: every wake-up is followed by a full sync, so the sleeping engine keeps no weights.
        self.rollout = RolloutWorker(self.config, self.config.model.path, reward=self.reward, sleep_level=2)
        self.weight_sync = ColocatedSync(
            self.actor, self.rollout, model_path=self.config.model.path,
            rollout_tp=int(self.config.rollout.tensor_model_parallel_size),
            bucket_size_bytes=self.bucket_size_bytes, integrity_check=self.integrity_check)
        print(f"[megarl] weight sync into vLLM: {self.weight_sync.path}", flush=True)
        if self.rollout.free_cache_engine:
            self.rollout.sleep()

    # ------------------------------------------------------------------ rollout
    def sync_weights(self) -> dict[str, float]:
        """The actor's weights into this rank's engine when it lacks them (collective over the
        world; every rank decides alike); see :class:`megarl.weight_sync.colocated.ColocatedSync`
        for the order and the metrics. ``{}`` when nothing had to move."""
        return self.weight_sync.sync() if self.weight_sync.needed else {}

    def generate_sequences(self, prompts: DataProto, *, validate: bool, do_sample: bool) -> DataProto:
        """This replica's share of prompts -> ``B * n`` rows (see RolloutWorker.generate_sequences,
        which takes ``validate`` / ``do_sample``), after syncing weights if they changed.
        meta_info["metrics"] gets the sync metrics and ``timing/generate_s``."""
        metrics = self.sync_weights()
        start = time.perf_counter()
        out = self.rollout.generate_sequences(prompts, validate=validate, do_sample=do_sample)
        metrics["timing/generate_s"] = time.perf_counter() - start
        metrics.update(phase_memory("rollout"))
        if self.rollout.sleep_freed_bytes is not None:
            metrics["memory/vllm_sleep_freed_gib"] = self.rollout.sleep_freed_bytes / 2**30
        out.meta_info["metrics"] = {**out.meta_info.get("metrics", {}), **metrics}
        return out

    # ------------------------------------------------------------------ async trainer modes
    def _session(self):
        """This replica's groups across calls (trainer.v1 colocate_async); at rollout TP > 1 on its leader."""
        if self.session is None:
            import torch.distributed as dist

            from megarl.parallel.layout import ParallelLayout
            from megarl.workers.phase_end import PhaseEnd
            from megarl.workers.rollout_session import RolloutSession

            self.session = RolloutSession(self.rollout)
            rollout = ParallelLayout(world_size=dist.get_world_size(), tp=self.config.rollout.tensor_model_parallel_size)
            self.phase_end = PhaseEnd(rollout.dp)
        return self.session

    def _follows(self) -> bool:
        """A rollout TP rank other than its replica's leader: it repeats the leader's engine operations."""
        return self.rollout.tp_channel is not None and not self.rollout.tp_channel.leads

    def pad_token_id(self) -> int:
        """The id the rollout pads responses with."""
        return self.rollout.pad_token_id

    def submit_groups(self, prompts: DataProto, gids: list[int]) -> None:
        """New groups for this replica (``rollout.n`` samples of each prompt row); they start generating at
        the next :meth:`advance`."""
        if not self._follows():
            self._session().submit(prompts, gids)

    def cancel_groups(self, gids: list[int]) -> None:
        """Stop generating these groups (evicted by the sampler)."""
        if not self._follows() and gids:
            self._session().cancel(gids)

    def advance(self, version: int, gids: list[int], count: int) -> dict[str, Any]:
        """After syncing the weights if they changed: generate until ``count`` of ``gids`` are finished
        (policy ``version`` stamped on every token) and, with other replicas, on through this replica's
        newer groups until every replica's share is finished (megarl.workers.phase_end); then interrupt
        what is still generating (it resumes at the next advance) and let the engine sleep. Collective
        over the world, like generate_sequences.

        Returns ``{"groups": {gid: samples}, "interrupted": requests paused, "metrics": {...}}``."""
        metrics = self.sync_weights()
        start = time.perf_counter()
        self.rollout.wake_up()
        if self._follows():
            from megarl.workers.engine_mirror import follow

            result = follow(self.rollout.llm.llm_engine, self.rollout.tp_channel)
        else:
            leader = self.rollout.leader_engine
            session = self._session()
            session.engine.version = version
            try:
                session.run_until(gids, count)
                if self.phase_end.replicas > 1:
                    share_done = time.perf_counter()
                    session.run_until(session.gids, len(session.gids), extra=self.phase_end.arrive())
                    metrics["timing_s/gen_past_share"] = time.perf_counter() - share_done  # replicas' mean
                interrupted = session.pause()
                result = {"groups": session.take_finished(), "interrupted": interrupted}
            except BaseException as exc:
                if leader is not None:
                    leader.end_batch(failure=f"{type(exc).__name__}: {exc}")
                raise
            if leader is not None:
                leader.end_batch(result)
        metrics["timing/generate_s"] = time.perf_counter() - start
        if self.rollout.free_cache_engine:
            self.rollout.sleep()
        return {**result, "metrics": metrics}

    # ------------------------------------------------------------------ training
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs``, ``entropys`` ``[B, R]`` (R2: and ``routed_experts``, see ActorWorker); when ``data``
        carries ``rollout_log_probs``, meta_info["metrics"] gets the rollout/actor log-prob gap."""
        from megarl.workers.megatron.inputs import response_mask_of

        out = self.actor.compute_log_prob(data)
        metrics = {**out.meta_info.get("metrics", {}), **phase_memory("old_log_prob")}
        if "rollout_log_probs" in data.batch.keys():
            mask = response_mask_of(data)
            metrics.update(log_prob_gap(data.batch["rollout_log_probs"], out.batch["old_log_probs"], mask))
        if metrics:
            out.meta_info["metrics"] = metrics
        return out

    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob`` ``[B, R]`` from the frozen reference (LoRA: the actor's base model)."""
        if self.role == "actor_rollout_ref" and self.actor.uses_lora:
            out = self.actor.compute_ref_log_prob(data)
        elif self.ref is None:
            raise RuntimeError("compute_ref_log_prob: this worker has no reference (role='actor_rollout')")
        else:
            out = self.ref.compute_log_prob(data)
        metrics = {**out.meta_info.get("metrics", {}), **phase_memory("ref_log_prob")}
        if metrics:
            out.meta_info["metrics"] = metrics
        return out

    def update_actor(self, data: DataProto) -> dict[str, float]:
        """PPO update; the rollout engine is re-synced before the next generation."""
        metrics = {**self.actor.update_policy(data), **phase_memory("update_actor")}
        self.weight_sync.mark_changed()
        return metrics

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, path: str, global_step: int = 0) -> None:
        self.actor.save_checkpoint(path, global_step=global_step)

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        meta = self.actor.load_checkpoint(path)
        self.weight_sync.mark_changed()
        return meta

    def shutdown(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None
        if self.rollout is not None:
            self.rollout.shutdown()
            self.rollout = None
