"""Rank bodies for tests/workers/test_distributed_optimizer.py (spawned by dist_utils.run_distributed):
Adam steps of the actor with megatron's distributed optimizer on or off, checkpoints in both of its
formats between two steps, and resumes from them."""

from __future__ import annotations

from helpers.tiny import actor_rollout_ref_config, dp_rows, megatron_node, worker_data
from worker_bodies import _allow_checkpoint_writer_processes, _export, _rank0

# Adam: its second step depends on the first step's moments and step count, so a wrongly sharded
# or wrongly restored state changes the weights. lr is large enough to move every weight visibly.
ADAM = {"optimizer": "adam", "lr": 1e-2, "lr_warmup_steps": -1, "lr_warmup_steps_ratio": 0.0,
        "lr_decay_style": "constant", "min_lr": 0.0, "weight_decay": 0.01, "betas": [0.9, 0.999],
        "clip_grad": 1.0, "total_training_steps": -1}
FORMATS = {"dp_reshardable": False, "fully_reshardable": True}  # -> megatron.dist_ckpt_optim_fully_reshardable


def _actor(model_path: str, dist_opt: bool, dtype: str = "float32", fully_reshardable: bool = False):
    from megarl.workers.actor import ActorWorker

    megatron = megatron_node(use_distributed_optimizer=dist_opt, dtype=dtype,
                             dist_ckpt_optim_fully_reshardable=fully_reshardable)
    actor = ActorWorker(actor_rollout_ref_config(model_path, megatron, optim=ADAM), "actor", device="cpu")
    actor.init_model()
    return actor


def _adam_state_numel(actor) -> int:
    """Elements of Adam's first moment held by this rank."""
    optimizer = actor.engine.optimizer
    states = [s for opt in getattr(optimizer, "chained_optimizers", [optimizer]) for s in opt.optimizer.state.values()]
    return sum(s["exp_avg"].numel() for s in states)


def _two_steps(actor, batch: dict, ckpt_dir: str | None = None) -> dict:
    data = worker_data(batch, dp_rows(batch))
    out = {"metrics": actor.update_policy(data), "adam_numel": _adam_state_numel(actor),
           "distributed": actor.engine.use_distributed_optimizer,
           "param_numel": sum(p.numel() for chunk in actor.engine.chunks for p in chunk.parameters())}
    if ckpt_dir is not None:
        _allow_checkpoint_writer_processes()
        actor.save_checkpoint(ckpt_dir)
    out["metrics_step2"] = actor.update_policy(data)
    out["updated_step2"] = _rank0(_export(actor))
    return out


def train(model_path: str, batch: dict, ckpt_dirs: dict[str, str]) -> dict:
    """Two steps with the plain optimizer, then per checkpoint format two steps with the
    distributed one, saving after the first."""
    out = {"plain": _two_steps(_actor(model_path, False), batch)}
    for fmt, ckpt_dir in ckpt_dirs.items():
        out[fmt] = _two_steps(_actor(model_path, True, fully_reshardable=FORMATS[fmt]), batch, ckpt_dir)
    return out


def resume(model_path: str, batch: dict, ckpt_dirs: dict[str, str]) -> dict:
    """Per format, a fresh actor loads its checkpoint, then takes the second step."""
    out = {}
    for fmt, ckpt_dir in ckpt_dirs.items():
        actor = _actor(model_path, True, fully_reshardable=FORMATS[fmt])
        actor.load_checkpoint(ckpt_dir)
        data = worker_data(batch, dp_rows(batch))
        out[fmt] = {"metrics_step2": actor.update_policy(data), "updated_step2": _rank0(_export(actor))}
    return out


def bf16_steps(model_path: str, batch: dict) -> dict:
    """bf16 parameters (fp32 main parameters in the optimizer), distributed optimizer on and off."""
    return {dist: _two_steps(_actor(model_path, dist, dtype="bfloat16"), batch) for dist in (False, True)}
