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


def _adam_steps(actor) -> list[float]:
    """The distinct Adam step counts of this rank's parameters (torch Adam inside megatron's optimizer)."""
    return sorted({float(state["step"]) for state in actor.engine.optimizer.optimizer.state.values()})


def _fsdp_actor(model_path: str, fsdp: bool = True):
    from megarl.workers.actor import ActorWorker

    megatron = megatron_node(use_distributed_optimizer=True, dtype="float32", use_megatron_fsdp=fsdp)
    actor = ActorWorker(actor_rollout_ref_config(model_path, megatron, optim=ADAM), "actor", device="cpu")
    actor.init_model()
    return actor


def step_save_step(model_path: str, batch: dict, ckpt_dir: str, fsdp: bool = True) -> dict:
    """One Adam step, save `ckpt_dir`, a second step: its weights W2, metrics, Adam step counts."""
    actor = _fsdp_actor(model_path, fsdp)
    data = worker_data(batch, dp_rows(batch))
    actor.update_policy(data)
    out = {"adam_steps_saved": _adam_steps(actor), "updated_step1": _rank0(_export(actor))}
    actor.save_checkpoint(ckpt_dir, global_step=1)
    out["metrics_step2"] = actor.update_policy(data)
    out["updated_step2"] = _rank0(_export(actor))
    return out


def load_step(model_path: str, batch: dict, ckpt_dir: str) -> dict:
    """A fresh FSDP actor loads `ckpt_dir`, then takes the second step."""
    actor = _fsdp_actor(model_path)
    meta = actor.load_checkpoint(ckpt_dir)
    out = {"meta": meta, "adam_steps_loaded": _adam_steps(actor), "loaded": _rank0(_export(actor)),
           "local_numel": sum(_local_numel(p) for chunk in actor.engine.chunks for p in chunk.parameters())}
    out["metrics_step2"] = actor.update_policy(worker_data(batch, dp_rows(batch)))
    out["updated_step2"] = _rank0(_export(actor))
    return out


def load_refused(model_path: str, ckpt_dir: str, fsdp: bool) -> str:
    """The refusal of an actor (`fsdp`: Megatron-FSDP or DDP) loading `ckpt_dir`."""
    actor = _fsdp_actor(model_path, fsdp)
    try:
        actor.load_checkpoint(ckpt_dir)
    except ValueError as refusal:
        return str(refusal)
    return "loaded"
