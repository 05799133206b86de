"""Free-form pass-through mappings checked against the engines that receive them:
`*.megatron.override_transformer_config` (Megatron's TransformerConfig fields) and
`actor_rollout_ref.rollout.engine_kwargs.vllm` (vllm.LLM / EngineArgs arguments). An
unknown name would otherwise fail inside a worker after Ray started.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
from collections.abc import Callable, Iterable, Iterator

from omegaconf import DictConfig

from megarl.config.errors import Issue, no_value
from megarl.config.rules.roles import active_roles
from megarl.config.rules.view import Skip, View, has_module

VLLM_KEY = "actor_rollout_ref.rollout.engine_kwargs.vllm"


@functools.cache
def transformer_config_fields() -> frozenset[str] | None:
    try:
        from megatron.core.transformer.transformer_config import TransformerConfig
    except Exception:  # megatron not importable in this process: the worker checks
        return None
    return frozenset(f.name for f in dataclasses.fields(TransformerConfig))


@functools.cache
def vllm_engine_args() -> frozenset[str] | None:
    """Arguments vllm.LLM accepts (its own parameters + EngineArgs fields); imports vLLM (seconds)."""
    try:
        from vllm import LLM
        from vllm.engine.arg_utils import EngineArgs
    except Exception:
        return None
    params = set(inspect.signature(LLM.__init__).parameters) - {"self", "kwargs"}
    return frozenset(params | {f.name for f in dataclasses.fields(EngineArgs)})


def _unknown(section: str, names: Iterable[str], known: frozenset[str], what: str) -> Iterator[Issue]:
    for name in names:
        if name in known:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.7)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        yield Issue(f"{section}.{name}", no_value(), f"not a {what}", f"{hint}remove {section}.{name}")


def _te_missing(overrides, v: View) -> str:
    """Why transformer-engine's layers will not run ("" when they will)."""
    impl = overrides.get("transformer_impl", "transformer_engine")
    return ("transformer_impl=local" if impl == "local" else "transformer-engine is not installed"
            if not v.installed("transformer_engine") else "trainer.device=cpu" if v.get("trainer.device") == "cpu" else "")


def _te_only(key: str, overrides, v: View) -> Iterator[Issue]:
    """FP8 (megatron's fp8 autocast is TE's), fused RoPE and MoE permutation (TE's kernels) and
    gradient-accumulation fusion (TE's wgrad GEMM; megatron's own linears need apex) run only in TE's
    layers on CUDA."""
    why = _te_missing(overrides, v)
    if not why:
        return
    if overrides.get("fp8"):
        yield Issue(f"{key}.fp8", overrides.get("fp8"), f"FP8 training needs transformer-engine's layers on CUDA ({why})",
                    f"remove {key}.fp8, or run on GPUs with transformer-engine and transformer_impl=transformer_engine")
    if overrides.get("apply_rope_fusion"):
        yield Issue(f"{key}.apply_rope_fusion", True, f"fused RoPE is transformer-engine's kernel ({why})",
                    f"remove {key}.apply_rope_fusion (megarl turns it on where TE's layers run)")
    if overrides.get("moe_permute_fusion"):
        yield Issue(f"{key}.moe_permute_fusion", True, f"fused MoE token permutation is transformer-engine's ({why})",
                    f"remove {key}.moe_permute_fusion (megarl turns it on where TE's layers run)")
    apex = v.get("trainer.device") != "cpu" and v.installed("fused_weight_gradient_mlp_cuda")
    if overrides.get("gradient_accumulation_fusion") and not apex:
        yield Issue(f"{key}.gradient_accumulation_fusion", True, "fused weight-gradient accumulation needs "
                    f"transformer-engine's layers on CUDA or apex's fused_weight_gradient_mlp_cuda ({why})",
                    f"remove {key}.gradient_accumulation_fusion (megarl turns it on where TE's layers run)")


_BACKENDS = ("flash", "fused", "unfused", "local", "auto")
FLASH_ATTN_MODULES = ("flash_attn", "flash_attn_3", "flash_attn_interface")


def attention_backend_that_runs(asked: str, *, te_runs: bool, has_flash: bool) -> str:
    """Megatron's attention_backend that runs for the `asked` one. verl's scripts ask for ``flash``;
    where transformer-engine's layers run without the flash-attn package (megarl's GPU stack) TE
    would find no kernel, deep in the first forward: its fused (cuDNN) attention, the same
    attention by another kernel, runs instead. Elsewhere as asked."""
    return "fused" if asked == "flash" and te_runs and not has_flash else asked


def _attention_backend(key: str, overrides, v: View) -> Iterator[Issue]:
    backend = overrides.get("attention_backend")
    if backend is not None and backend not in _BACKENDS:
        yield Issue(f"{key}.attention_backend", backend, f"not one of {list(_BACKENDS)}",
                    f"set {key}.attention_backend to one of {list(_BACKENDS)}")


def attention_notice(cfg: DictConfig, installed: Callable[[str], bool] = has_module) -> str | None:
    """One line naming the roles of a validated `cfg` whose ``attention_backend=flash`` runs as TE's
    fused attention (see attention_backend_that_runs) on machines with the packages `installed`
    says; None when none does."""
    v = View(cfg, set(), installed=installed)
    has_flash = any(v.installed(m) for m in FLASH_ATTN_MODULES)
    keys = []
    for role in active_roles(v):
        key = f"{role.megatron}.override_transformer_config"
        overrides = v.get(key) or {}
        backend = overrides.get("attention_backend")
        if backend == "flash" and attention_backend_that_runs(backend, te_runs=not _te_missing(overrides, v),
                                                              has_flash=has_flash) != backend:
            keys.append(f"{key}.attention_backend")
    if not keys:
        return None
    return (f"{', '.join(keys)}=flash: flash-attn is not installed, so transformer-engine's fused (cuDNN) "
            "attention runs instead (the same attention, another kernel)")


def engine_overrides(v: View) -> Iterator[Issue]:
    seen: set[str] = set()
    for role in active_roles(v):
        key = f"{role.megatron}.override_transformer_config"
        try:
            overrides = v.get(key) or {}
        except Skip:
            continue
        if overrides and key not in seen and (fields := transformer_config_fields()) is not None:
            seen.add(key)
            yield from _unknown(key, overrides, fields, "Megatron TransformerConfig field")
            yield from _te_only(key, overrides, v)
            yield from _attention_backend(key, overrides, v)
    extra = v.get(VLLM_KEY) or {}
    if extra and (known := vllm_engine_args()) is not None:
        yield from _unknown(VLLM_KEY, extra, known, "vllm.LLM engine argument")


def lora_on_grouped_experts(v: View) -> Iterator[Issue]:
    """megarl's LoRA adapts each expert's own linears (megarl/models/lora.py; a LoRA build makes every expert an
    MLP of its own): grouped experts asked for explicitly are refused here, before Ray starts."""
    rank = v.get("actor_rollout_ref.model.lora.rank")
    key = "actor_rollout_ref.actor.megatron.override_transformer_config"
    if rank and (v.get(key) or {}).get("moe_grouped_gemm"):
        yield Issue(f"{key}.moe_grouped_gemm", True, "LoRA on grouped experts (every expert's weight in one module) is "
                    "not implemented in megarl", f"remove {key}.moe_grouped_gemm: with LoRA each expert is built as "
                    "an MLP of its own, which LoRA adapts")


RULES = (engine_overrides, lora_on_grouped_experts)
