"""Rank body for tests/workers/test_optim.py: Megatron optimizers and lr schedules built by
`MegatronEngine` from `load_config(CPU_SMALL + overrides)`, one process (dist_utils.run_distributed)."""

from __future__ import annotations

ACTOR = "actor_rollout_ref.actor"


def _engine(model_path: str, overrides: list[str]):
    from helpers.cpu_config import CPU_SMALL

    from megarl.config import ConfigError, collect_issues, load_config, resolve_config
    from megarl.workers.megatron.engine import MegatronEngine

    cfg = load_config([*CPU_SMALL, f"actor_rollout_ref.model.path={model_path}", *overrides])
    issues = [i for i in collect_issues(cfg) if ".optim." in i.key]  # no data files here: only the optim rules
    if issues:
        raise ConfigError(issues)
    cfg = resolve_config(cfg)
    engine = MegatronEngine(cfg.actor_rollout_ref.actor.megatron, model_path, optim_cfg=cfg.actor_rollout_ref.actor.optim,
                            prefix=ACTOR, device="cpu")
    engine.init_model()
    return engine


def _groups(engine) -> dict[str, dict]:
    """The default param group (weight decay on), the no-decay group (biases, norms) and, when
    `decoupled_lr` is set, the embedding/output group."""
    groups = engine.optimizer.param_groups
    out = {"decay": groups[0], "no_decay": next(g for g in groups if g["wd_mult"] == 0.0)}
    assert out["decay"]["wd_mult"] == 1.0 and out["decay"]["default_config"]
    decoupled = [g for g in groups if not g["default_config"]]
    if decoupled:
        out["decoupled"] = decoupled[0]
    return out


def _record(engine, steps: int) -> dict[str, list[float]]:
    """lr / weight decay of each group at scheduler steps 0..steps-1 (as `train_step` reads them)."""
    seq: dict[str, list[float]] = {}
    for _ in range(steps):
        for name, group in _groups(engine).items():
            seq.setdefault(f"lr_{name}", []).append(group["lr"])
            seq.setdefault(f"wd_{name}", []).append(group["weight_decay"])
        engine.step_scheduler()
    return seq


def schedules(model_path: str, cases: dict[str, tuple[list[str], int]]) -> dict[str, dict]:
    """Per case (overrides, steps): the recorded lr / wd sequences, the Megatron OptimizerConfig
    fields and the torch optimizer's hyper-parameters of the default group."""
    out = {}
    for name, (overrides, steps) in cases.items():
        engine = _engine(model_path, overrides)
        config = engine.optimizer.config
        torch_group = engine.optimizer.optimizer.param_groups[0]
        out[name] = {
            "seq": _record(engine, steps),
            "config": {k: getattr(config, k) for k in ("optimizer", "lr", "min_lr", "weight_decay", "adam_beta1",
                                                        "adam_beta2", "adam_eps", "clip_grad", "sgd_momentum",
                                                        "decoupled_lr", "use_precision_aware_optimizer")},
            "torch_group": {k: v for k, v in torch_group.items() if k in ("betas", "eps", "momentum")},
            "torch_class": type(engine.optimizer.optimizer).__name__,
        }
    return out


def resume(model_path: str, ckpt_dir: str, saved: list[str], steps_before: int,
           loads: dict[str, tuple[list[str], list[str]]], steps_after: int) -> dict[str, list[float]]:
    """Save after `steps_before` scheduler steps (config `saved`), then per case (config, load
    contents) a fresh engine loads the checkpoint: its default group's lr over `steps_after` steps."""
    from megarl.workers.megatron.checkpoint import load_checkpoint, save_checkpoint
    from worker_bodies import _allow_checkpoint_writer_processes

    _allow_checkpoint_writer_processes()
    engine = _engine(model_path, saved)
    for chunk in engine.chunks:  # one optimizer step (zero gradients): Adam state to save
        chunk.zero_grad_buffer()
    engine.optimizer.step()
    for _ in range(steps_before):
        engine.step_scheduler()
    save_checkpoint(engine, ckpt_dir, contents=["model", "optimizer", "extra"])
    out = {}
    for name, (overrides, contents) in loads.items():
        engine = _engine(model_path, overrides)
        load_checkpoint(engine, ckpt_dir, contents=contents)
        out[name] = _record(engine, steps_after)["lr_decay"]
    return out
