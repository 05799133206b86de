"""Optimizer and lr-schedule rules (`*.optim`, verl's McoreOptimizerConfig): what megatron-core's
`OptimizerConfig` / `OptimizerParamScheduler` would assert on, or megarl could not honour, refused
before start-up with the key and the fix (megarl/workers/megatron/optim.py builds both).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from collections.abc import Iterator

from megarl.config.errors import Issue, no_value
from megarl.config.names import OPTIM_STATE_DTYPES
from megarl.config.rules.roles import ACTOR, CRITIC, Role, critic_enabled
from megarl.config.rules.view import Skip, View
from megarl.config.schema.megatron import OPTIMIZER_FIELDS_FROM_KEYS

_STATE_DTYPE_KEYS = ("main_grads_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")
_CPU_OFFLOAD = "optimizer_cpu_offload"  # Megatron OptimizerConfig's switch of its HybridDeviceOptimizer


def _trained(v: View) -> list[tuple[str, Role]]:
    """(section, role) of each model that has an optimizer in this run."""
    roles = [("actor_rollout_ref.actor", ACTOR)]
    if critic_enabled(v):
        roles.append(("critic", CRITIC))
    return roles


def _each_section(rule):
    @functools.wraps(rule)
    def run(v: View) -> Iterator[Issue]:
        for section, role in _trained(v):
            try:
                yield from rule(v, section, role)
            except Skip:
                continue

    return run


@_each_section
def schedule(v: View, section: str, role: Role) -> Iterator[Issue]:
    o = f"{section}.optim"
    lr, min_lr, init = v.get(f"{o}.lr"), v.get(f"{o}.min_lr"), v.get(f"{o}.lr_warmup_init")
    if min_lr > lr:
        yield Issue(f"{o}.min_lr", min_lr, f"above the peak {o}.lr={lr} (the lr floor of the decay)", f"set {o}.min_lr <= {lr}")
    if init > lr:
        yield Issue(f"{o}.lr_warmup_init", init, f"above the peak {o}.lr={lr} (warmup rises from it to lr)", f"set {o}.lr_warmup_init <= {lr}")
    style = v.get(f"{o}.lr_decay_style")
    if style == "WSD" and v.get(f"{o}.lr_wsd_decay_steps") is None:
        yield Issue(f"{o}.lr_wsd_decay_steps", None, "lr_decay_style=WSD needs the length of its final decay phase",
                    f"set {o}.lr_wsd_decay_steps (steps), or another {o}.lr_decay_style")
    decay, warmup = v.get(f"{o}.lr_decay_steps"), v.get(f"{o}.lr_warmup_steps")
    if decay is not None and warmup >= decay:
        yield Issue(f"{o}.lr_warmup_steps", warmup, f"does not fit in the {decay}-step schedule ({o}.lr_decay_steps)",
                    f"set {o}.lr_warmup_steps < {decay}, or raise {o}.lr_decay_steps")


def _hybrid(v: View, optim: str) -> bool:
    """Whether `optim`'s Megatron optimizer is its HybridDeviceOptimizer (`optimizer_cpu_offload`, off by default)."""
    return bool((v.get(f"{optim}.override_optimizer_config") or {}).get(_CPU_OFFLOAD, False))


def _param_dtype(v: View, role: Role) -> str:
    dtype = v.get(f"{role.megatron}.dtype")
    if dtype == "auto":
        return {"cpu": "float32", "cuda": "bfloat16"}.get(v.get("trainer.device"), "auto")
    return dtype


@_each_section
def precision_aware(v: View, section: str, role: Role) -> Iterator[Issue]:
    """Megatron's precision-aware optimizer (state below fp32) runs only in TransformerEngine's
    FusedAdam (on a GPU) or in its HybridDeviceOptimizer (`optimizer_cpu_offload`, on any device), under
    the distributed optimizer, for bf16/fp16 parameters (verl: bf16 only)."""
    o = f"{section}.optim"
    key = f"{o}.use_precision_aware_optimizer"
    if not v.get(key):
        for name in _STATE_DTYPE_KEYS:
            if (value := v.get(f"{o}.{name}")) != "fp32":
                yield Issue(f"{o}.{name}", value, "takes effect only with the precision-aware optimizer",
                            f"set {key}=true, or {o}.{name}=fp32")
        return
    needs = []
    if not _hybrid(v, o):  # Megatron's HybridDeviceOptimizer keeps the fp32 main parameters itself
        if v.get("trainer.device") == "cpu":
            needs.append(("trainer.device=cpu", "CUDA (trainer.device=cuda)"))
        if not v.installed("transformer_engine"):
            needs.append(("transformer-engine is not installed", "transformer-engine's FusedAdam"))
    if v.get(f"{o}.optimizer") != "adam":
        needs.append((f"{o}.optimizer={v.get(f'{o}.optimizer')}", f"{o}.optimizer=adam"))
    if not v.get(f"{role.megatron}.use_distributed_optimizer"):
        needs.append((f"{role.megatron}.use_distributed_optimizer=false", f"{role.megatron}.use_distributed_optimizer=true"))
    if (dtype := _param_dtype(v, role)) == "float32":
        needs.append((f"{role.megatron}.dtype resolves to float32", f"{role.megatron}.dtype=bfloat16"))
    if needs:
        have, need = zip(*needs)
        yield Issue(key, True, f"Megatron's precision-aware optimizer cannot run here: {'; '.join(have)}",
                    f"set {key}=false, or provide {', '.join(need)}")


@_each_section
def distributed_needs_adam(v: View, section: str, role: Role) -> Iterator[Issue]:
    """Megatron's distributed optimizer shards only Adam's state (its checkpoint format)."""
    o = f"{section}.optim.optimizer"
    if v.get(f"{role.megatron}.use_distributed_optimizer") and v.get(o) != "adam":
        yield Issue(o, v.get(o), f"Megatron's distributed optimizer ({role.megatron}.use_distributed_optimizer=true) "
                                 "supports only adam", f"set {o}=adam, or {role.megatron}.use_distributed_optimizer=false")


_CPU_OFFLOAD_ONLY = {"optimizer_offload_fraction": 0.0, "overlap_cpu_optimizer_d2h_h2d": False}  # Megatron's defaults


@_each_section
def cpu_offload(v: View, section: str, role: Role) -> Iterator[Issue]:
    """Megatron's CPU optimizer (`override_optimizer_config.optimizer_cpu_offload`, its HybridDeviceOptimizer):
    what megatron-core 0.19.2 runs correctly, and no setting of it without it."""
    o = f"{section}.optim"
    key = f"{o}.override_optimizer_config"
    overrides = v.get(key) or {}
    if not _hybrid(v, o):
        for name, default in _CPU_OFFLOAD_ONLY.items():
            if overrides.get(name, default) != default:
                yield Issue(f"{key}.{name}", overrides[name], f"takes effect only with {key}.{_CPU_OFFLOAD}=true",
                            f"set {key}.{_CPU_OFFLOAD}=true, or remove {key}.{name}")
        return
    fraction = overrides.get("optimizer_offload_fraction", 0.0)
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction <= 1:
        yield Issue(f"{key}.optimizer_offload_fraction", fraction,
                    "the share of the optimizer state kept and stepped in host memory (Megatron's default 0 offloads "
                    f"nothing) must be in (0, 1] with {_CPU_OFFLOAD}=true",
                    f"set {key}.optimizer_offload_fraction in (0, 1] (verl's scripts: 1)")
    if not v.get(f"{role.megatron}.use_distributed_optimizer"):
        yield Issue(f"{key}.{_CPU_OFFLOAD}", True, "Megatron's HybridDeviceOptimizer runs under its distributed optimizer "
                    "only (the plain mixed-precision optimizer replaces the parameters it has mapped: a KeyError at the "
                    "first step)", f"set {role.megatron}.use_distributed_optimizer=true")
    elif not v.get(f"{o}.use_precision_aware_optimizer"):
        yield Issue(f"{key}.{_CPU_OFFLOAD}", True, "without the precision-aware optimizer the hybrid optimizer steps the "
                    "distributed optimizer's fp32 main parameters, which stay on the GPU (4 bytes a parameter), and "
                    "megatron-core 0.19.2 cannot load its checkpoint (hybrid_optimizer.py "
                    "_update_fp32_params_by_new_state: KeyError)", f"set {o}.use_precision_aware_optimizer=true, as verl's scripts do")
    for name in ("exp_avg_dtype", "exp_avg_sq_dtype"):
        if (value := v.get(f"{o}.{name}")) != "fp32":
            yield Issue(f"{o}.{name}", value, "Megatron's HybridDeviceOptimizer keeps Adam's moments in fp32 on both devices",
                        f"set {o}.{name}=fp32, or {key}.{_CPU_OFFLOAD}=false")


@functools.cache
def optimizer_config_fields() -> dict[str, object] | None:
    """Megatron OptimizerConfig field name -> type, or None when megatron is not importable here."""
    try:
        from megatron.core.optimizer import OptimizerConfig
    except Exception:  # the worker's OptimizerConfig(**) reports it then
        return None
    return {f.name: f.type for f in dataclasses.fields(OptimizerConfig)}


@_each_section
def optimizer_overrides(v: View, section: str, role: Role) -> Iterator[Issue]:
    """`override_optimizer_config`: Megatron OptimizerConfig field names, not ones a megarl key sets."""
    key = f"{section}.optim.override_optimizer_config"
    overrides = v.get(key) or {}
    fields = optimizer_config_fields() if overrides else None
    if fields is None:
        return
    import torch

    for name, value in overrides.items():
        if name not in fields:
            close = difflib.get_close_matches(name, sorted(fields), n=3, cutoff=0.7)
            hint = f"did you mean {' or '.join(close)}? " if close else ""
            yield Issue(f"{key}.{name}", no_value(), "not a Megatron OptimizerConfig field (megatron.core.optimizer)",
                        f"{hint}remove {key}.{name}")
        elif name in OPTIMIZER_FIELDS_FROM_KEYS:
            owner = f"{section}.{OPTIMIZER_FIELDS_FROM_KEYS[name]}"
            yield Issue(f"{key}.{name}", value, f"megarl sets this OptimizerConfig field from {owner}",
                        f"remove it from {key} and set {owner}")
        elif fields[name] in (torch.dtype, "torch.dtype") and value not in OPTIM_STATE_DTYPES:
            yield Issue(f"{key}.{name}", value, "a dtype field: give a dtype name", f"set {key}.{name} to one of {list(OPTIM_STATE_DTYPES)}")


RULES = (schedule, precision_aware, distributed_needs_adam, cpu_offload, optimizer_overrides)
