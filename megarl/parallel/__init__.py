"""Process groups: torch.distributed from the environment, then megatron parallel_state.

After :func:`init_distributed`, ``megatron.core.parallel_state`` is the single source of
truth for every rank and group (TP, PP, VPP, CP, EP, ETP, DP).
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from megarl.parallel.cpu_compat import apply_cpu_compat, apply_missing_te_compat

__all__ = ["init_distributed", "parallel_sizes", "set_seed"]

# verl's `actor_rollout_ref.actor.megatron` keys read here, with their defaults.
_SIZE_KEYS = {
    "tensor_model_parallel_size": 1,
    "pipeline_model_parallel_size": 1,
    "virtual_pipeline_model_parallel_size": None,
    "context_parallel_size": 1,
    "expert_model_parallel_size": 1,
    "expert_tensor_parallel_size": None,
}


def parallel_sizes(megatron_cfg: Mapping[str, Any]) -> dict[str, int | None]:
    """The parallel sizes of a verl-style ``megatron`` config node, defaults filled in.

    Raises:
        ValueError: a size is not a positive integer (message names the key).
    """
    sizes: dict[str, int | None] = {}
    for key, default in _SIZE_KEYS.items():
        value = megatron_cfg.get(key, default) if megatron_cfg is not None else default
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"megatron.{key} must be a positive integer or null, got {value!r}")
        sizes[key] = value
    return sizes


def _device_type(device: str | torch.device) -> str:
    device_type = torch.device(device).type
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    return device_type


def init_distributed(megatron_cfg: Mapping[str, Any], device: str | torch.device) -> None:
    """Initialise torch.distributed and megatron's model-parallel groups (idempotent).

    Reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` (and ``LOCAL_RANK`` on
    CUDA) from the environment; gloo on CPU, nccl on CUDA. On CPU the compatibility layer
    :mod:`megarl.parallel.cpu_compat` is installed first. Sizes come from the verl keys
    ``tensor_model_parallel_size``, ``pipeline_model_parallel_size``,
    ``virtual_pipeline_model_parallel_size``, ``context_parallel_size``,
    ``expert_model_parallel_size``, ``expert_tensor_parallel_size``; the data-parallel size
    is what remains of ``WORLD_SIZE``. Also seeds torch/python RNGs from ``megatron.seed``
    (default 42), see :func:`set_seed`.

    Raises:
        ValueError: a bad size, or WORLD_SIZE not divisible by tp*pp*cp (and by
            etp*ep*pp for MoE), or a second call with different sizes.
    """
    from megatron.core import parallel_state

    device_type = _device_type(device)
    sizes = parallel_sizes(megatron_cfg)
    if device_type == "cpu":
        apply_cpu_compat()
    else:
        apply_missing_te_compat()
        if "LOCAL_RANK" in os.environ:
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))

    if not dist.is_initialized():
        dist.init_process_group(backend="gloo" if device_type == "cpu" else "nccl")
    world_size = dist.get_world_size()

    tp, pp, cp = (sizes[k] for k in ("tensor_model_parallel_size",
                                       "pipeline_model_parallel_size",
                                       "context_parallel_size"))
    ep = sizes["expert_model_parallel_size"]
    etp = sizes["expert_tensor_parallel_size"] or tp
    if world_size % (tp * pp * cp) != 0:
        raise ValueError(
            f"WORLD_SIZE={world_size} is not divisible by megatron.tensor_model_parallel_size "
            f"({tp}) * pipeline_model_parallel_size ({pp}) * context_parallel_size ({cp})"
        )
    if world_size % (etp * ep * pp) != 0:
        raise ValueError(
            f"WORLD_SIZE={world_size} is not divisible by megatron.expert_tensor_parallel_size "
            f"({etp}) * expert_model_parallel_size ({ep}) * pipeline_model_parallel_size ({pp})"
        )
    vpp = sizes["virtual_pipeline_model_parallel_size"]
    if vpp is not None and pp == 1 and vpp > 1:
        raise ValueError(
            "megatron.virtual_pipeline_model_parallel_size needs pipeline_model_parallel_size > 1"
        )

    if parallel_state.model_parallel_is_initialized():
        current = (
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_pipeline_model_parallel_world_size(),
            parallel_state.get_context_parallel_world_size(),
            parallel_state.get_expert_model_parallel_world_size(),
            parallel_state.get_virtual_pipeline_model_parallel_world_size(),
        )
        if current != (tp, pp, cp, ep, vpp):
            raise ValueError(
                f"model parallel already initialised with (tp, pp, cp, ep, vpp)={current}, "
                f"asked for {(tp, pp, cp, ep, vpp)}"
            )
    else:
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=pp,
            virtual_pipeline_model_parallel_size=vpp,
            context_parallel_size=cp,
            expert_model_parallel_size=ep,
            expert_tensor_parallel_size=sizes["expert_tensor_parallel_size"],
        )
    set_seed(int(megatron_cfg.get("seed", 42)) if megatron_cfg is not None else 42, device_type)


def set_seed(seed: int, device: str | torch.device) -> None:
    """Seed python/torch RNGs; megatron's model-parallel CUDA RNG tracker on CUDA only.

    Like megatron's own seeding, pipeline stages get distinct seeds (``seed + 100 * pp_rank``)
    so their dropout masks differ. On CPU ``model_parallel_cuda_manual_seed`` cannot run
    (it asserts CUDA); CPU runs use dropout 0 or eval mode where that tracker matters.
    """
    from megatron.core import parallel_state, tensor_parallel

    stage_seed = seed + 100 * parallel_state.get_pipeline_model_parallel_rank()
    random.seed(stage_seed)
    torch.manual_seed(stage_seed)
    try:
        import numpy as np

        np.random.seed(stage_seed)
    except ImportError:
        pass
    if _device_type(device) == "cuda":
        tensor_parallel.model_parallel_cuda_manual_seed(stage_seed)
