"""Rank bodies for tests/workers/test_megatron_fsdp.py (spawned by dist_utils.run_distributed): two Adam
steps of the actor wrapped in DDP (distributed optimizer) or in Megatron-FSDP, on the same rows."""

from __future__ import annotations

import torch

from dist_optim_bodies import ADAM
from helpers.tiny import actor_rollout_ref_config, dp_rows, megatron_node, worker_data
from worker_bodies import _export, _rank0


def _local_numel(param: torch.Tensor) -> int:
    """Elements this rank stores: a DTensor's local shard, a plain tensor's all."""
    return param.to_local().numel() if hasattr(param, "to_local") else param.numel()


def two_steps(model_path: str, batch: dict, fsdp: bool) -> dict:
    from megarl.workers.actor import ActorWorker

    megatron = megatron_node(use_distributed_optimizer=True, dtype="float32", use_megatron_fsdp=fsdp)
    actor = ActorWorker(actor_rollout_ref_config(model_path, megatron, optim=ADAM), "actor", device="cpu")
    actor.init_model()
    params = [p for chunk in actor.engine.chunks for p in chunk.parameters()]
    data = worker_data(batch, dp_rows(batch))
    out = {"local_numel": sum(_local_numel(p) for p in params), "model_numel": sum(p.numel() for p in params),
           "wrapper": type(actor.engine.chunks[0]).__name__, "metrics": actor.update_policy(data)}
    out["metrics_step2"] = actor.update_policy(data)
    out["updated_step2"] = _rank0(_export(actor))
    out["local_numel_after"] = sum(_local_numel(p) for chunk in actor.engine.chunks for p in chunk.parameters())
    return out
