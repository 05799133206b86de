"""Megatron optimizer + learning-rate schedule from a verl `optim` node.

Keys read (`actor_rollout_ref.actor.optim` / `critic.optim`, verl's McoreOptimizerConfig), all by
attribute: optimizer (adam|sgd), lr, min_lr, weight_decay, betas, clip_grad,
use_precision_aware_optimizer + main_grads_dtype / exp_avg_dtype / exp_avg_sq_dtype,
override_optimizer_config (other Megatron `OptimizerConfig` fields) -> `optimizer_config`;
lr_warmup_init, lr_warmup_steps, lr_warmup_steps_ratio, lr_decay_steps, lr_decay_style,
lr_wsd_decay_style, lr_wsd_decay_steps, weight_decay_incr_style, total_training_steps (set by
the trainer; -1 = unknown), use_checkpoint_opt_param_scheduler -> `build_scheduler` (megatron-core's
`OptimizerParamScheduler`). `megatron.use_distributed_optimizer` shards optimizer state over DP
(gloo on CPU, NCCL on GPU). A non-finite gradient is never applied (`guard_nonfinite_grads`);
the workers decide whether that stops the run (`trainer.nan_policy`, megarl.utils.nonfinite).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from megarl.compat.megatron_core.hybrid_optimizer import apply_cpu_hybrid_optimizer, fit_hybrid_optimizer
from megarl.compat.megatron_core.optimizer import (
    apply_cpu_optimizer,
    cpu_params_pass_cuda_type_checks,
    fit_torch_adam,
    init_sgd_state,
    match_param_groups_without_lr_bounds,
)
from megarl.config.schema.megatron import OPTIMIZER_FIELDS_FROM_KEYS, OptimConfig

__all__ = [
    "build_optimizer", "build_scheduler", "optimizer_config", "schedule_steps", "grad_reduce_in_fp32",
    "guard_nonfinite_grads",
]

logger = logging.getLogger(__name__)

# Names of `main_grads_dtype` / `exp_avg_dtype` / `exp_avg_sq_dtype` (and dtype-valued overrides).
_STATE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.uint8}


def state_dtype(name: str) -> torch.dtype:
    """torch dtype of a precision-aware optimizer dtype name (`main_grads_dtype`, `exp_avg_dtype`,
    ...). fp8 Adam moments are uint8 tensors (TransformerEngine's FusedAdam, Megatron-LM's map)."""
    return _STATE_DTYPES[name]


def grad_reduce_in_fp32(optim_cfg) -> bool:
    """Megatron DDP's `grad_reduce_in_fp32`: the gradient buffer the optimizer reads is fp32 unless
    the precision-aware optimizer keeps main gradients in a lower `main_grads_dtype` (as verl does)."""
    return not (optim_cfg.use_precision_aware_optimizer and optim_cfg.main_grads_dtype != "fp32")


def optimizer_config(optim_cfg: OptimConfig, *, use_distributed_optimizer: bool, dtype: torch.dtype, prefix: str) -> OptimizerConfig:
    """Megatron `OptimizerConfig` of a verl `optim` node (typed keys, then `override_optimizer_config`).

    Args:
        dtype: the model's parameter dtype (`megatron.dtype` resolved); bf16/fp16 select
            Megatron's mixed-precision optimizer with fp32 main parameters.
        prefix: dotted path of `optim_cfg` for error messages (e.g. "critic.optim").
    """
    beta1, beta2 = optim_cfg.betas
    args: dict[str, Any] = {
        "optimizer": optim_cfg.optimizer,
        "lr": float(optim_cfg.lr),
        "min_lr": float(optim_cfg.min_lr),
        "weight_decay": float(optim_cfg.weight_decay),
        "adam_beta1": float(beta1),
        "adam_beta2": float(beta2),
        "clip_grad": float(optim_cfg.clip_grad),
        "bf16": dtype == torch.bfloat16,
        "fp16": dtype == torch.float16,
        "params_dtype": dtype,
        "use_distributed_optimizer": use_distributed_optimizer,
        "use_precision_aware_optimizer": bool(optim_cfg.use_precision_aware_optimizer),
        "main_grads_dtype": state_dtype(optim_cfg.main_grads_dtype),
        "exp_avg_dtype": state_dtype(optim_cfg.exp_avg_dtype),
        "exp_avg_sq_dtype": state_dtype(optim_cfg.exp_avg_sq_dtype),
    }
    args.update(_overrides(optim_cfg.override_optimizer_config, prefix))
    return OptimizerConfig(**args)


def _overrides(overrides: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """`override_optimizer_config` as OptimizerConfig kwargs (dtype names become torch dtypes).

    The config rule (megarl.config.rules.optim) refuses the same names before start-up; this
    repeats it for engines built without `validate_config`.
    """
    fields = {f.name: f.type for f in dataclasses.fields(OptimizerConfig)}
    out = {}
    for name, value in (overrides or {}).items():
        key = f"{prefix}.override_optimizer_config.{name}"
        if name not in fields:
            raise ValueError(f"{key}: not a Megatron OptimizerConfig field")
        if name in OPTIMIZER_FIELDS_FROM_KEYS:
            raise ValueError(f"{key}: set by megarl from {OPTIMIZER_FIELDS_FROM_KEYS[name]}; set that key instead")
        if fields[name] in (torch.dtype, "torch.dtype"):
            if value not in _STATE_DTYPES:
                raise ValueError(f"{key}={value!r}: choose one of {sorted(_STATE_DTYPES)}")
            value = _STATE_DTYPES[value]
        out[name] = value
    return out


def build_optimizer(
    chunks: Sequence[torch.nn.Module],
    optim_cfg: OptimConfig,
    *,
    use_distributed_optimizer: bool,
    dtype: torch.dtype,
    device: str,
    prefix: str,
):
    """`get_megatron_optimizer` for DDP-wrapped `chunks` (config: `optimizer_config`).

    Args:
        prefix: dotted path of `optim_cfg` for error messages (e.g. "critic.optim").
        use_distributed_optimizer: shard the optimizer state over DP (on CPU too: gloo).
    """
    config = optimizer_config(optim_cfg, use_distributed_optimizer=use_distributed_optimizer, dtype=dtype, prefix=prefix)
    if device == "cpu":
        apply_cpu_optimizer()
        if config.optimizer_cpu_offload:
            apply_cpu_hybrid_optimizer()
    with cpu_params_pass_cuda_type_checks() if device == "cpu" else contextlib.nullcontext():
        optimizer = guard_nonfinite_grads(get_megatron_optimizer(config, list(chunks)))
    fit_torch_adam(optimizer)
    fit_hybrid_optimizer(optimizer)
    match_param_groups_without_lr_bounds(optimizer)
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        if getattr(opt, "init_state_fn", None) is None and config.optimizer == "sgd":
            opt.init_state_fn = init_sgd_state  # needed to load an SGD checkpoint
    return optimizer


def guard_nonfinite_grads(optimizer):
    """Make ``optimizer.step()`` skip (not apply) a step whose gradient norm is NaN/Inf.

    Megatron skips a step only on an fp16 loss-scale overflow; in bf16/fp32 it would apply
    NaN gradients and poison the weights. Here the grad norm (over the model-parallel
    group; DP grads are already reduced, so every rank agrees) is checked after
    ``prepare_grads``: non-finite -> ``step()`` returns ``(False, norm, None)`` with the
    weights and optimizer state untouched. ``step()`` also returns the norm when
    ``clip_grad`` is 0 (megatron returns None then), so callers always see it.
    ``optimizer.megarl_last_step["scaler_overflow"]`` tells an fp16 loss-scale overflow
    (a normal skip while the scale adapts) from a non-finite gradient.
    """
    prepare, step = optimizer.prepare_grads, optimizer.step
    last = {"norm": None, "scaler_overflow": False}

    def prepare_grads() -> bool:
        last["norm"], last["scaler_overflow"] = None, False
        if prepare():  # fp16 loss-scale overflow: megatron's own skip (the scaler backs off)
            last["norm"], last["scaler_overflow"] = float("nan"), True
            return True
        norm = float(optimizer.get_grad_norm())
        last["norm"] = norm
        return not math.isfinite(norm)

    def guarded_step():
        success, grad_norm, zeros = step()
        if grad_norm is None:
            grad_norm = last["norm"]
        return success, grad_norm, zeros

    optimizer.prepare_grads = prepare_grads
    optimizer.step = guarded_step
    optimizer.megarl_last_step = last  # {"norm", "scaler_overflow"} of the latest step()
    return optimizer


def schedule_steps(optim_cfg: OptimConfig, *, prefix: str) -> tuple[int, int]:
    """(warmup steps, decay-end step) of the lr schedule, as verl derives them.

    `lr_decay_steps` null = `total_training_steps`. The warmup is `lr_warmup_steps` when > 0,
    else `int(lr_warmup_steps_ratio * decay steps)`. Megatron's schedule reaches `min_lr` at
    step `lr_decay_steps` (counted from step 0, warmup included). With no known length
    (`total_training_steps` = -1 and `lr_decay_steps` null) only a constant lr without a warmup
    ratio is defined; the decay end is then a placeholder just past the warmup.
    """
    total = int(optim_cfg.total_training_steps)
    decay_steps = optim_cfg.lr_decay_steps if optim_cfg.lr_decay_steps is not None else total
    warmup = int(optim_cfg.lr_warmup_steps)
    ratio = float(optim_cfg.lr_warmup_steps_ratio)
    if decay_steps <= 0:
        if optim_cfg.lr_decay_style != "constant" or (warmup <= 0 and ratio > 0):
            what = f"lr_decay_style={optim_cfg.lr_decay_style!r}" if optim_cfg.lr_decay_style != "constant" else f"lr_warmup_steps_ratio={ratio}"
            raise ValueError(
                f"{prefix}.{what} needs the schedule length: {prefix}.total_training_steps > 0 "
                f"(the trainer sets it) or {prefix}.lr_decay_steps"
            )
        return max(warmup, 0), max(warmup, 0) + 1
    if warmup <= 0:
        warmup = int(ratio * decay_steps)
    if warmup >= decay_steps:
        raise ValueError(
            f"{prefix}.lr_warmup_steps: {warmup} warmup steps do not fit in the {decay_steps}-step schedule "
            f"({prefix}.lr_decay_steps, null = total_training_steps); lower the warmup or lengthen the schedule"
        )
    return warmup, decay_steps


class ConfigOptimizerParamScheduler(OptimizerParamScheduler):
    """megatron-core's `OptimizerParamScheduler` whose resume follows
    `use_checkpoint_opt_param_scheduler` for the param groups' lr bounds too.

    Megatron's param groups carry their own `max_lr` / `min_lr` (which `get_lr` prefers to the
    scheduler's), and loading the optimizer state brings back the checkpoint's. After the
    scheduler's own `load_state_dict` (checkpoint or config values by the flag, step count always
    from the checkpoint) the groups are set to match: true = the checkpoint's schedule (default
    groups take its max/min lr), false = the lr bounds this optimizer was built with (config).
    """

    def __init__(self, optimizer, **kwargs) -> None:
        super().__init__(optimizer, **kwargs)
        self._built_lr_bounds = [(g["max_lr"], g["min_lr"]) for g in optimizer.param_groups]

    def load_state_dict(self, state_dict: dict) -> None:
        if self.use_checkpoint_opt_param_scheduler and state_dict["lr_decay_style"] == "WSD" and self.wsd_decay_steps is None:
            raise ValueError(  # megatron does not checkpoint the WSD phase length
                "the checkpoint's lr schedule is WSD and use_checkpoint_opt_param_scheduler=true keeps it, but "
                "optim.lr_wsd_decay_steps is null: set it (and lr_wsd_decay_style) as in the saved run"
            )
        super().load_state_dict(state_dict)
        for group, (max_lr, min_lr) in zip(self.optimizer.param_groups, self._built_lr_bounds):
            if not self.use_checkpoint_opt_param_scheduler:
                group["max_lr"], group["min_lr"] = max_lr, min_lr
            elif group["default_config"]:
                group["max_lr"], group["min_lr"] = self.max_lr, self.min_lr
        self.step(increment=0)  # lr / weight decay of the groups from the bounds just set


def build_scheduler(optimizer, optim_cfg: OptimConfig, *, prefix: str) -> ConfigOptimizerParamScheduler:
    """Megatron's lr / weight-decay schedule from a verl `optim` node, as verl builds it.

    lr: linear warmup `lr_warmup_init` -> `lr` over the warmup steps, then `lr_decay_style`
    (constant | linear | cosine | inverse-square-root | WSD with `lr_wsd_decay_style` over the
    last `lr_wsd_decay_steps`) down to `min_lr` at step `lr_decay_steps` (see `schedule_steps`).
    Weight decay: `weight_decay` throughout — verl passes start = end = weight_decay, so
    `weight_decay_incr_style` has nothing to ramp between.
    One scheduler step per training step (`MegatronEngine.step_scheduler`, once per
    update_policy / update_critic call), as verl counts `total_training_steps`.
    """
    warmup, decay_steps = schedule_steps(optim_cfg, prefix=prefix)
    total = int(optim_cfg.total_training_steps)
    weight_decay = float(optim_cfg.weight_decay)
    keep_checkpoint = bool(optim_cfg.use_checkpoint_opt_param_scheduler)
    return ConfigOptimizerParamScheduler(
        optimizer,
        init_lr=float(optim_cfg.lr_warmup_init),
        max_lr=float(optim_cfg.lr),
        min_lr=float(optim_cfg.min_lr),
        lr_warmup_steps=warmup,
        lr_decay_steps=decay_steps,
        lr_decay_style=optim_cfg.lr_decay_style,
        start_wd=weight_decay,
        end_wd=weight_decay,
        wd_incr_steps=total if total > 0 else decay_steps,
        wd_incr_style=optim_cfg.weight_decay_incr_style,
        use_checkpoint_opt_param_scheduler=keep_checkpoint,
        override_opt_param_scheduler=not keep_checkpoint,
        wsd_decay_steps=optim_cfg.lr_wsd_decay_steps,
        lr_wsd_decay_style=optim_cfg.lr_wsd_decay_style,
    )
