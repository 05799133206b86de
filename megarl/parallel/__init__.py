"""Process groups: torch.distributed from the environment, then megatron parallel_state.

The layout arithmetic (sizes, rules, each rank's coordinates) is :class:`ParallelLayout`;
after :func:`init_distributed`, ``megatron.core.parallel_state`` holds the groups built
from it. torch and megatron are imported inside the functions, so that the config checks
can use :class:`ParallelLayout` without loading them.
"""

from __future__ import annotations

import datetime
import math
import os
import random
from typing import TYPE_CHECKING, Any

from megarl.parallel.layout import MEGATRON_ORDER, ParallelLayout

if TYPE_CHECKING:
    import torch

__all__ = ["ParallelLayout", "init_distributed", "set_seed"]


def _device_type(device: str | torch.device) -> str:
    import torch

    device_type = torch.device(device).type
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    return device_type


def init_distributed(megatron_cfg: Any, device: str | torch.device, *, seed: int,
                     timeout_s: int | None = None) -> ParallelLayout:
    """Initialise torch.distributed and megatron's model-parallel groups (idempotent).

    Reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` (and ``LOCAL_RANK`` on
    CUDA) from the environment; rank 0 builds on the store it already listens on when it opened one
    (:mod:`megarl.parallel.rendezvous`); gloo on CPU, nccl on CUDA, bound to the interface that reaches
    ``MASTER_ADDR`` unless GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME say otherwise
    (:mod:`megarl.parallel.net_iface`). On CPU megatron-core's CPU shims
    (:mod:`megarl.compat.megatron_core.cpu`) are installed first. The layout is
    :meth:`ParallelLayout.from_megatron_config` of ``megatron_cfg`` over the world (verl's
    ``*.megatron`` parallel-size keys; the data-parallel size is what remains). Also seeds
    torch/python RNGs from ``seed`` (the role's ``megatron.seed``), see :func:`set_seed`.
    ``timeout_s``: how long a collective may wait before it fails (verl's ``nccl_timeout``), for the
    default group and megatron's model-parallel groups (whole minutes, rounded up); None: torch's default.

    Returns:
        The layout the groups were built from.

    Raises:
        ValueError: a bad size, a layout that does not fit the world
            (:meth:`ParallelLayout.validate`), or a second call with different sizes.
    """
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    from megarl.compat.megatron_core.cpu import apply_cpu
    from megarl.parallel.net_iface import use_route_to_master
    from megarl.parallel.rendezvous import take_rendezvous

    device_type = _device_type(device)
    if device_type == "cpu":
        apply_cpu()
    elif "LOCAL_RANK" in os.environ:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))

    if not dist.is_initialized():
        use_route_to_master()  # across machines: gloo / NCCL on the interface that reaches MASTER_ADDR
        timeout = {} if timeout_s is None else {"timeout": datetime.timedelta(seconds=timeout_s)}
        backend = "gloo" if device_type == "cpu" else "nccl"
        store = take_rendezvous("world")
        if store is not None:  # this process is rank 0 and already listens (megarl.parallel.rendezvous)
            # as torch's env:// rendezvous does for the other ranks: its timeout, its "default_pg" key prefix
            store.set_timeout(timeout.get("timeout", dist.constants.default_pg_timeout))
            dist.init_process_group(backend=backend, store=dist.PrefixStore("default_pg", store),
                                    rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]), **timeout)
        else:
            dist.init_process_group(backend=backend, **timeout)
    layout = ParallelLayout.from_megatron_config(megatron_cfg or {}, dist.get_world_size())
    layout.validate()

    if parallel_state.model_parallel_is_initialized():
        current = ParallelLayout.from_parallel_state()
        if current != layout:
            raise ValueError(f"model parallel already initialised as {current}, asked for {layout}")
    else:
        minutes = {} if timeout_s is None else {"distributed_timeout_minutes": math.ceil(timeout_s / 60)}
        parallel_state.initialize_model_parallel(**layout.megatron_sizes(), order=MEGATRON_ORDER, **minutes)
    set_seed(seed, device_type)
    return layout


def set_seed(seed: int, device: str | torch.device) -> None:
    """Seed python/torch RNGs; megatron's model-parallel CUDA RNG tracker on CUDA only.

    Like megatron's own seeding, pipeline stages get distinct seeds (``seed + 100 * pp_rank``)
    so their dropout masks differ. On CPU ``model_parallel_cuda_manual_seed`` cannot run
    (it asserts CUDA); CPU runs use dropout 0 or eval mode where that tracker matters.
    """
    import torch
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
