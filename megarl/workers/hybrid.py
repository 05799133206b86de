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
the next ``generate_sequences`` first streams them into vLLM (export over TP/PP/EP ->
plan buckets -> checked -> ``reload_weights``, or straight into vLLM's parameters where
that is exact: :mod:`megarl.weight_sync.direct`), and returns the sync metrics in its
``meta_info["metrics"]``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from megarl.models.lora import merged_weights
from megarl.protocol import DataProto
from megarl.weight_sync import SyncStats, log_prob_gap, plan_for_model, stream_in_process
from megarl.weight_sync.direct import direct_targets

if TYPE_CHECKING:
    from megarl.config.schema_algorithm import RolloutCorrectionConfig
    from megarl.reward.managers import RewardSpec

ROLES = ("actor_rollout_ref", "actor_rollout")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def gpu_memory(phase: str) -> dict[str, float]:
    """``memory/{phase}_peak_gib`` (torch allocator peak since the last phase) and
    ``memory/{phase}_device_used_gib`` (whole device, vLLM's pools included) on CUDA."""
    if not torch.cuda.is_available():
        return {}
    free, total = torch.cuda.mem_get_info()
    peak = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    return {f"memory/{phase}_peak_gib": peak / 2**30, f"memory/{phase}_device_used_gib": (total - free) / 2**30}


class ActorRolloutRefWorker:
    """Actor + optional reference + rollout in one process.

    Args:
        config: the ``actor_rollout_ref`` subtree.
        role: ``"actor_rollout_ref"`` builds the reference model (the trainer uses it
            when ``actor.use_kl_loss`` or ``algorithm.use_kl_in_reward``);
            ``"actor_rollout"`` does not.
        device: ``"cpu"`` | ``"cuda"``; default cuda when available.
        rollout_correction: ``algorithm.rollout_correction``, for the actor's
            ``policy_loss.loss_mode=bypass_mode`` (see :class:`ActorWorker`).
        reward: the reward spec when training samples are scored in the agent loop as they finish
            (``reward.launch_reward_fn_async`` with ``rollout.mode=async``; see RolloutWorker).
    """

    def __init__(
        self,
        config: Any,
        role: str = "actor_rollout_ref",
        device: str | None = None,
        rollout_correction: RolloutCorrectionConfig | None = None,
        reward: RewardSpec | None = None,
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
        self.actor = ActorWorker(config, role="actor", device=device, rollout_correction=rollout_correction)
        # With LoRA the reference is the actor's base model (adapters off): no second model.
        want_ref = role == "actor_rollout_ref" and not self.actor.uses_lora
        self.ref = ActorWorker(config, role="ref", device=device) if want_ref else None
        self.rollout = None
        self.reward = reward
        self.plan = None
        self.direct = None  # DirectTargets when vLLM's parameters take the export as is
        sync_cfg = config.rollout.weight_sync
        bucket_mb = float(sync_cfg.bucket_size_mb)
        if bucket_mb <= 0:
            raise ValueError(
                f"actor_rollout_ref.rollout.weight_sync.bucket_size_mb must be > 0, got {bucket_mb}"
            )
        self.bucket_size_bytes = int(bucket_mb * 2**20)
        self.integrity_check = bool(sync_cfg.integrity_check)
        self._weights_version = 0
        self._synced_version = -1

    # ------------------------------------------------------------------ setup
    def init_model(self) -> None:
        """Megatron models (process groups first), then the vLLM engine (joins that world)
        and the resharding plan. The engine has dummy weights until the first sync."""
        from megarl.workers.rollout import RolloutWorker

        self.actor.init_model()
        if self.ref is not None:
            self.ref.init_model()
        self.rollout = RolloutWorker(self.config, self.config.model.path, reward=self.reward)
        engine = self.actor.engine
        dtype = _DTYPES[str(self.rollout.llm.llm_engine.model_config.dtype).replace("torch.", "")]
        self.plan = plan_for_model(
            engine.hf_config,
            engine.unwrapped_chunks()[0].config,
            self.config.model.path,
            world_size=torch.distributed.get_world_size(),
            rollout_tp=int(self.config.rollout.tensor_model_parallel_size),
            bucket_size_bytes=self.bucket_size_bytes,
            dtype=dtype,
        )
        mc = self.config.actor.megatron
        self.direct, why = direct_targets(
            self.rollout.model(), self.plan, rollout_tp=int(self.config.rollout.tensor_model_parallel_size),
            actor_sharded=max(mc.tensor_model_parallel_size, mc.pipeline_model_parallel_size,
                              mc.expert_model_parallel_size) > 1)
        print(f"[megarl] weight sync into vLLM: {'direct into its parameters' if self.direct else 'reload_weights (' + why + ')'}",
              flush=True)

    # ------------------------------------------------------------------ rollout
    def sync_weights(self) -> dict[str, float]:
        """Stream the actor's weights into this rank's engine (collective over the world).

        Returns ``weight_sync/{seconds, bytes, gb_per_s, buckets, tensors, peak_extra_bytes}``.
        """
        stats = SyncStats()
        engine = self.actor.engine
        wake_s = 0.0
        if self.direct:  # vLLM's parameters back on the device, at the same addresses (not sync time)
            wake_s = self.rollout.wake_up()
        start = time.perf_counter()
        self.actor.onload()
        try:
            if self.actor.uses_lora:
                with merged_weights(engine.chunks):  # vLLM gets W + alpha/r * B @ A
                    self._load_into_rollout(engine, stats)
                # the merged tensors lived for this sync only: keep no views of them
                from megarl.weight_sync.tp_gather import release_export_buffers

                release_export_buffers()
                if self.direct:
                    self.direct.forget_sources()
            else:
                self._load_into_rollout(engine, stats)
        finally:
            self.actor.offload()
        stats.seconds = time.perf_counter() - start
        self._synced_version = self._weights_version
        return {**stats.as_metrics(), "weight_sync/direct": float(self.direct is not None), "timing_s/vllm_wake": wake_s}

    def _load_into_rollout(self, engine, stats: SyncStats) -> None:
        from megarl.weight_sync.tp_gather import export_hf_weights_bucketed

        if self.direct:
            self.direct.load_from(engine.chunks, engine.hf_config, bucket_size_bytes=self.bucket_size_bytes,
                                  integrity_check=self.integrity_check, stats=stats)
            self.rollout.reset_prefix_cache()
        else:
            # One all_gather per bucket for TP-only layouts (per-tensor export for PP/EP).
            export = export_hf_weights_bucketed(engine.chunks, engine.hf_config, bucket_size_bytes=self.bucket_size_bytes)
            stream = stream_in_process(export, self.plan, integrity_check=self.integrity_check, stats=stats)
            self.rollout.update_weights(stream)

    def generate_sequences(self, prompts: DataProto, *, validate: bool, do_sample: bool) -> DataProto:
        """This replica's share of prompts -> ``B * n`` rows (see RolloutWorker.generate_sequences,
        which takes ``validate`` / ``do_sample``), after syncing weights if they changed.
        meta_info["metrics"] gets the sync metrics and ``timing/generate_s``."""
        metrics: dict[str, float] = {}
        if self._synced_version != self._weights_version:
            metrics.update(self.sync_weights())
        start = time.perf_counter()
        out = self.rollout.generate_sequences(prompts, validate=validate, do_sample=do_sample)
        metrics["timing/generate_s"] = time.perf_counter() - start
        metrics.update(gpu_memory("rollout"))
        if self.rollout.sleep_freed_bytes is not None:
            metrics["memory/vllm_sleep_freed_gib"] = self.rollout.sleep_freed_bytes / 2**30
        out.meta_info["metrics"] = {**out.meta_info.get("metrics", {}), **metrics}
        return out

    # ------------------------------------------------------------------ training
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs``, ``entropys`` ``[B, R]``; when ``data`` carries
        ``rollout_log_probs``, meta_info["metrics"] gets the rollout/actor log-prob gap."""
        from megarl.workers.megatron.inputs import response_mask_of

        out = self.actor.compute_log_prob(data)
        metrics = gpu_memory("old_log_prob")
        if "rollout_log_probs" in data.batch.keys():
            mask = response_mask_of(data)
            metrics.update(log_prob_gap(data.batch["rollout_log_probs"], out.batch["old_log_probs"], mask))
        if metrics:
            out.meta_info["metrics"] = metrics
        return out

    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob`` ``[B, R]`` from the frozen reference (LoRA: the actor's base model)."""
        if self.role == "actor_rollout_ref" and self.actor.uses_lora:
            return self.actor.compute_ref_log_prob(data)
        if self.ref is None:
            raise RuntimeError("compute_ref_log_prob: this worker has no reference (role='actor_rollout')")
        return self.ref.compute_log_prob(data)

    def update_actor(self, data: DataProto) -> dict[str, float]:
        """PPO update; the rollout engine is re-synced before the next generation."""
        metrics = {**self.actor.update_policy(data), **gpu_memory("update_actor")}
        self._weights_version += 1
        return metrics

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, path: str, global_step: int = 0) -> None:
        self.actor.save_checkpoint(path, global_step=global_step)

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        meta = self.actor.load_checkpoint(path)
        self._weights_version += 1
        return meta

    def shutdown(self) -> None:
        if self.rollout is not None:
            self.rollout.shutdown()
            self.rollout = None
