"""Megatron optimizer + learning-rate schedule from a verl `optim` node.

Keys read (`actor_rollout_ref.actor.optim` / `critic.optim`): optimizer (adam|sgd), lr,
lr_warmup_steps (-1 = lr_warmup_steps_ratio * total_training_steps), lr_warmup_steps_ratio,
lr_decay_style (constant|linear|cosine), min_lr_ratio, weight_decay, betas, clip_grad,
total_training_steps (set by the trainer; -1 = unknown, only `constant` decay allowed),
use_checkpoint_opt_param_scheduler (on resume: false = the schedule's values come from this
config, true = from the checkpoint; the step count always comes from the checkpoint).
`megatron.use_distributed_optimizer` shards optimizer state over DP (GPU only, see below).
A non-finite gradient is never applied (`guard_nonfinite_grads`); the workers decide
whether that stops the run (`trainer.nan_policy`, megarl.utils.nonfinite).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

__all__ = ["build_optimizer", "build_scheduler", "apply_cpu_optimizer_compat", "guard_nonfinite_grads"]

logger = logging.getLogger(__name__)

_DECAY_STYLES = ("constant", "linear", "cosine")
_OPTIMIZERS = ("adam", "sgd")
_CPU_APPLIED = False


def apply_cpu_optimizer_compat() -> None:
    """megatron-core 0.16.1's fp32 optimizer path on CPU (idempotent; CPU runs only).

    `FP32Optimizer` and the grad-norm / clip helpers allocate with a literal
    `device="cuda"`, and `clip_grad_by_total_norm_fp32` asserts `torch.cuda.FloatTensor`
    grads. The first is redirected like the pipeline schedules (`megarl.parallel.cpu_compat`),
    the second replaced by the same scaling without the device assertion, and megatron's
    pure-torch l2-norm fallback (which returns a "cuda" tensor) by a CPU one.
    """
    global _CPU_APPLIED
    if _CPU_APPLIED:
        return
    from megatron.core.optimizer import clip_grads
    from megatron.core.optimizer import optimizer as mcore_optimizer

    from megarl.parallel.cpu_compat import _TorchCudaToCpu

    clip_grads.torch = _TorchCudaToCpu()
    mcore_optimizer.torch = _TorchCudaToCpu()

    def clip_grad_by_total_norm_cpu(parameters, max_norm, total_norm, use_decoupled_grad=False):
        if isinstance(parameters, torch.Tensor):
            parameters = [parameters]
        attr = "decoupled_grad" if use_decoupled_grad else "grad"
        clip_coeff = max_norm / (total_norm + 1.0e-6)
        if clip_coeff < 1.0:
            for param in parameters:
                grad = getattr(param, attr, None)
                if grad is not None:
                    grad.detach().mul_(clip_coeff)

    mcore_optimizer.clip_grad_by_total_norm_fp32 = clip_grad_by_total_norm_cpu

    def l2_norm_cpu(chunk_size, noop_flag, tensor_lists, per_tensor, *args):
        norms = [torch.norm(t) for tensors in tensor_lists for t in tensors]
        return torch.norm(torch.stack(norms)).reshape(1).float(), None

    from megatron.core.utils import local_multi_tensor_l2_norm

    if clip_grads.l2_norm_impl is local_multi_tensor_l2_norm:  # the fallback allocates on "cuda"
        clip_grads.l2_norm_impl = l2_norm_cpu
    _CPU_APPLIED = True


def _get(cfg: Mapping[str, Any], key: str, default: Any, prefix: str) -> Any:
    """cfg[key], or `default` when missing or null (`prefix` kept for symmetry of call sites)."""
    value = cfg.get(key, default) if cfg is not None else default
    return default if value is None else value


def build_optimizer(
    chunks: Sequence[torch.nn.Module],
    optim_cfg: Mapping[str, Any],
    *,
    use_distributed_optimizer: bool,
    dtype: torch.dtype,
    device: str,
    prefix: str,
):
    """`get_megatron_optimizer` for DDP-wrapped `chunks`.

    Args:
        prefix: dotted path of `optim_cfg` for error messages (e.g. "critic.optim").
        use_distributed_optimizer: ignored with a warning on CPU, where megatron-core
            0.16.1's distributed optimizer rejects non-CUDA tensors.
    """
    name = _get(optim_cfg, "optimizer", "adam", prefix)
    if name not in _OPTIMIZERS:
        raise ValueError(f"{prefix}.optimizer={name!r} is not supported; choose one of {_OPTIMIZERS}")
    if optim_cfg.get("lr") is None:
        raise ValueError(f"{prefix}.lr is required")
    lr = float(optim_cfg["lr"])
    betas = list(_get(optim_cfg, "betas", [0.9, 0.999], prefix))
    if len(betas) != 2:
        raise ValueError(f"{prefix}.betas must be [beta1, beta2], got {betas}")
    if device == "cpu":
        apply_cpu_optimizer_compat()
    config = OptimizerConfig(
        optimizer=name,
        lr=lr,
        min_lr=lr * float(_get(optim_cfg, "min_lr_ratio", 0.0, prefix)),
        weight_decay=float(_get(optim_cfg, "weight_decay", 0.01, prefix)),
        adam_beta1=float(betas[0]),
        adam_beta2=float(betas[1]),
        clip_grad=float(_get(optim_cfg, "clip_grad", 1.0, prefix)),
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        params_dtype=dtype,
        use_distributed_optimizer=use_distributed_optimizer,
    )
    optimizer = guard_nonfinite_grads(get_megatron_optimizer(config, list(chunks)))
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        if getattr(opt, "init_state_fn", None) is None and name == "sgd":
            opt.init_state_fn = _init_sgd_state  # needed to load an SGD checkpoint
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


def _init_sgd_state(torch_optimizer: torch.optim.Optimizer, config=None) -> None:
    """Zero momentum buffers (what SGD's first step would otherwise create lazily).

    megatron builds the optimizer part of a checkpoint request from existing state; SGD
    has none before its first step and megatron-core ships no init function for it.
    A zero buffer gives the same first step as a lazily created one (buf = grad).
    """
    for group in torch_optimizer.param_groups:
        for param in group["params"]:
            state = torch_optimizer.state[param]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(param.data)


def build_scheduler(optimizer, optim_cfg: Mapping[str, Any], *, prefix: str) -> OptimizerParamScheduler:
    """Linear warmup from 0 to `lr`, then `lr_decay_style` down to `lr * min_lr_ratio`.

    One scheduler step per training step (`MegatronEngine.step_scheduler`, once per
    update_policy / update_critic call), as verl counts `total_training_steps`.
    `use_checkpoint_opt_param_scheduler` (verl): when a checkpoint's scheduler state is loaded,
    false overrides its lr / min lr / warmup / decay / weight decay with this config's
    (megatron's `override_opt_param_scheduler`), true keeps the checkpoint's. Either way the
    schedule continues at the checkpoint's step count (verl's false restarts it at 0, which
    would repeat the warmup).
    """
    use_checkpoint = bool(optim_cfg["use_checkpoint_opt_param_scheduler"])
    lr = float(optim_cfg.get("lr"))
    total = int(_get(optim_cfg, "total_training_steps", -1, prefix))
    style = _get(optim_cfg, "lr_decay_style", "constant", prefix)
    if style not in _DECAY_STYLES:
        raise ValueError(f"{prefix}.lr_decay_style={style!r} is not supported; choose one of {_DECAY_STYLES}")
    warmup = int(_get(optim_cfg, "lr_warmup_steps", -1, prefix))
    if warmup < 0:
        ratio = float(_get(optim_cfg, "lr_warmup_steps_ratio", 0.0, prefix))
        if ratio > 0 and total <= 0:
            raise ValueError(
                f"{prefix}.lr_warmup_steps_ratio={ratio} needs {prefix}.total_training_steps > 0 "
                "(the trainer sets it), or set lr_warmup_steps"
            )
        warmup = int(ratio * max(total, 0))
    if style != "constant" and total <= 0:
        raise ValueError(f"{prefix}.lr_decay_style={style!r} needs {prefix}.total_training_steps > 0")
    decay_steps = max(total, warmup + 1, 1)
    weight_decay = float(_get(optim_cfg, "weight_decay", 0.01, prefix))
    return OptimizerParamScheduler(
        optimizer,
        init_lr=0.0,
        max_lr=lr,
        min_lr=lr * float(_get(optim_cfg, "min_lr_ratio", 0.0, prefix)),
        lr_warmup_steps=warmup,
        lr_decay_steps=decay_steps,
        lr_decay_style=style,
        start_wd=weight_decay,
        end_wd=weight_decay,
        wd_incr_steps=decay_steps,
        wd_incr_style="constant",
        use_checkpoint_opt_param_scheduler=use_checkpoint,
        override_opt_param_scheduler=not use_checkpoint,
    )
