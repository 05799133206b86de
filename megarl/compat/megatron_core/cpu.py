"""Run megatron-core on CPU (gloo): the few places that assume CUDA.

:func:`apply_cpu` is applied by :func:`megarl.parallel.init_distributed` only when the device is
CPU. Everything megatron
needs beyond this (SDPA core attention instead of the default ``DotProductAttention``, the
``allgather`` MoE dispatcher, seeding without ``model_parallel_cuda_manual_seed``) is chosen in
``megarl.models`` / ``megarl.parallel`` rather than patched; the TransformerConfig settings a CPU
model needs are :func:`cpu_transformer_settings`.

Process-wide changes, each a :data:`SHIMS` entry: ``torch.cuda.current_device()`` returns
``torch.device("cpu")`` and ``torch.cuda.synchronize()`` is a no-op; megatron's pipeline schedules
see a ``torch`` whose ``device="cuda"`` allocations go to CPU; its CUDA RNG tracker's ``fork`` is a
no-op; tied embeddings and RoPE under context parallelism skip their ``.cuda()`` moves; DDP's
gradient sync waits on a stream that does nothing.
"""

from __future__ import annotations

import contextlib

import torch

from megarl.compat.cuda_on_cpu import TorchCudaToCpu, without_cuda_moves
from megarl.compat.shim import Shim, source_has

__all__ = ["SHIMS", "apply_cpu", "cpu_transformer_settings", "MOE_DISPATCHER_ON_CPU"]

MCORE = ("megatron-core==0.19.2",)
_FSDP = "megatron.core.distributed.fsdp.src.megatron_fsdp"
_APPLIED = False


SHIMS = (
    Shim("torch.cuda.current_device", MCORE, ("cpu",),
         "megatron allocates p2p shape buffers, grad buffers and router/expert tensors with "
         "device=torch.cuda.current_device(), which raises without CUDA: it returns torch.device('cpu')",
         source_has("megatron.core.pipeline_parallel.p2p_communication", None, "torch.cuda.current_device()")),
    Shim("torch.cuda.synchronize", MCORE, ("cpu",),
         "p2p communication (p2p_communication.py), DDP and parallel_state synchronize the device: a no-op",
         source_has("megatron.core.pipeline_parallel.p2p_communication", None, "torch.cuda.synchronize()")),
    Shim("megatron.core.pipeline_parallel.schedules.torch", MCORE, ("cpu",),
         'the schedules allocate total_num_tokens with a literal device="cuda" (schedules.py:749, 1121, 2292): '
         "their torch is a TorchCudaToCpu",
         source_has("megatron.core.pipeline_parallel.schedules", None, 'device="cuda"')),
    Shim("CudaRNGStatesTracker.fork", MCORE, ("cpu",),
         "sequence-parallel regions (the embedding's dropout) fork megatron's CUDA RNG tracker, which CPU runs "
         "never seed (model_parallel_cuda_manual_seed asserts CUDA): they run on the CPU generator instead",
         source_has("megatron.core.tensor_parallel.random", "CudaRNGStatesTracker.fork", "_get_cuda_rng_state")),
    Shim("LanguageModule.setup_embeddings_and_output_layer", MCORE, ("cpu",),
         "with tied embeddings and PP > 1 it moves the last stage's embedding copy to CUDA "
         "(language_module.py:307 weight.data.cuda()) before the first/last-stage all-reduce: Tensor.cuda is "
         "the identity while it runs",
         source_has("megatron.core.models.common.language_module.language_module",
                     "LanguageModule.setup_embeddings_and_output_layer", ".cuda()")),
    Shim("rotary_pos_embedding.get_pos_emb_on_this_cp_rank", MCORE, ("cpu",),
         "RoPE under context parallelism builds this CP rank's chunk index in pinned memory and moves it with "
         ".cuda() (rope_utils.py:48-70): the rotary modules get the same selection with the index on the "
         "embedding's device",
         source_has("megatron.core.models.common.embeddings.rope_utils", "get_pos_emb_on_this_cp_rank", ".cuda(")),
    Shim("megatron.core.distributed.param_and_grad_buffer.torch", MCORE, ("cpu",),
         "_ParamAndGradBucketGroup.start_grad_sync waits on torch.cuda.current_stream() for CUDA-graph wgrad "
         "events unconditionally, every step (param_and_grad_buffer.py:632): its torch is a TorchCudaToCpu, "
         "whose current stream waits on nothing",
         source_has("megatron.core.distributed.param_and_grad_buffer", "_ParamAndGradBucketGroup.start_grad_sync",
                    "torch.cuda.current_stream()")),
    Shim("Megatron-FSDP torch", MCORE, ("cpu",),
         "Megatron-FSDP (megatron_fsdp.py, param_and_grad_buffer.py) runs its collectives on torch.cuda streams and "
         "compares its device with torch.device(f'cuda:{current_device()}') (megatron_fsdp.py:234): their torch is a "
         "TorchCudaToCpu whose cuda device strings name the CPU",
         source_has(f"{_FSDP}.megatron_fsdp", "MegatronFSDP.__init__", "torch.cuda.current_device()")),
    Shim("FullyShardedDataParallel device mesh", MCORE, ("cpu",),
         "the adapter builds its DTensor mesh with DeviceMesh.from_group(device_type='cuda') "
         "(mcore_fsdp_adapter.py:_init_dist_index), which moves every shard to CUDA: the mesh is a CPU one",
         source_has("megatron.core.distributed.fsdp.mcore_fsdp_adapter", "FullyShardedDataParallel._init_dist_index",
                    'device_type="cuda"')),
    Shim("uneven_dtensor.validate_uneven_dtensor", MCORE, ("cpu",),
         "it moves each shard's chunk metadata with .cuda() (uneven_dtensor.py:187): Tensor.cuda is the identity "
         "while it runs",
         source_has(f"{_FSDP}.uneven_dtensor", "validate_uneven_dtensor", ".cuda()")),
    Shim("TransformerConfig CPU settings", MCORE, ("cpu",),
         "bias_activation_fusion (megatron's torch.compile'd bias_swiglu) and the fused kernels need CUDA/apex/TE; "
         "use_cpu_initialization: parameters are initialised on the host (cpu_transformer_settings)"),
    Shim("moe_token_dispatcher_type on CPU", MCORE, ("cpu",),
         "the alltoall MoE token dispatcher creates a CUDA stream; CPU runs use allgather (MOE_DISPATCHER_ON_CPU)"),
)

MOE_DISPATCHER_ON_CPU = "allgather"


def cpu_transformer_settings(on_cpu: bool) -> dict[str, bool]:
    """TransformerConfig fields that depend on the device: unfused paths and host initialisation
    on CPU. On CUDA the SwiGLU is megatron's fused (torch.compile) bias_swiglu, as in plain
    Megatron-LM (the eager silu * mul and its backward are slower)."""
    return {"bias_activation_fusion": not on_cpu, "use_cpu_initialization": on_cpu}


def apply_cpu() -> None:
    """Install the CPU shims of :data:`SHIMS` (idempotent). Call only for CPU runs."""
    global _APPLIED
    if _APPLIED:
        return
    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.cuda.synchronize = lambda device=None: None

    from megatron.core.distributed import param_and_grad_buffer
    from megatron.core.models.common.language_module.language_module import LanguageModule
    from megatron.core.pipeline_parallel import schedules

    schedules.torch = TorchCudaToCpu()
    param_and_grad_buffer.torch = TorchCudaToCpu()
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker

    CudaRNGStatesTracker.fork = lambda self, name=None: contextlib.nullcontext()
    LanguageModule.setup_embeddings_and_output_layer = without_cuda_moves(
        LanguageModule.setup_embeddings_and_output_layer
    )
    from megatron.core.models.common.embeddings import rotary_pos_embedding, yarn_rotary_pos_embedding

    rotary_pos_embedding.get_pos_emb_on_this_cp_rank = _pos_emb_on_this_cp_rank
    yarn_rotary_pos_embedding.get_pos_emb_on_this_cp_rank = _pos_emb_on_this_cp_rank
    _apply_fsdp_cpu()
    _APPLIED = True


class _TorchCudaDevicesToCpu(TorchCudaToCpu):
    """A TorchCudaToCpu whose ``device("cuda...")`` is the CPU (Megatron-FSDP spells its device
    ``f"cuda:{torch.cuda.current_device()}"``, which reads ``cuda:cpu`` here)."""

    @staticmethod
    def device(*args, **kwargs):
        if args and isinstance(args[0], str) and args[0].startswith("cuda"):
            return torch.device("cpu")
        return torch.device(*args, **kwargs)


class _CpuDeviceMesh:
    """``DeviceMesh`` as the Megatron-FSDP adapter sees it: ``from_group`` builds a CPU mesh."""

    @staticmethod
    def from_group(*args, device_type: str, **kwargs):
        from torch.distributed import DeviceMesh

        return DeviceMesh.from_group(*args, device_type="cpu", **kwargs)


def _apply_fsdp_cpu() -> None:
    """The Megatron-FSDP entries of :data:`SHIMS`."""
    from megatron.core.distributed.fsdp import mcore_fsdp_adapter
    from megatron.core.distributed.fsdp.src.megatron_fsdp import megatron_fsdp, uneven_dtensor
    from megatron.core.distributed.fsdp.src.megatron_fsdp import param_and_grad_buffer as fsdp_buffer

    megatron_fsdp.torch = _TorchCudaDevicesToCpu()
    fsdp_buffer.torch = _TorchCudaDevicesToCpu()
    mcore_fsdp_adapter.DeviceMesh = _CpuDeviceMesh
    uneven_dtensor.validate_uneven_dtensor = without_cuda_moves(uneven_dtensor.validate_uneven_dtensor)
    fsdp_buffer.validate_uneven_dtensor = uneven_dtensor.validate_uneven_dtensor


def _pos_emb_on_this_cp_rank(pos_emb: torch.Tensor, seq_dim: int, cp_group) -> torch.Tensor:
    """megatron's ``rope_utils.get_pos_emb_on_this_cp_rank`` with its chunk index on ``pos_emb``'s
    device: of the ``2 * cp`` chunks along ``seq_dim``, chunks ``r`` and ``2 * cp - 1 - r``."""
    cp_size, cp_rank = cp_group.size(), cp_group.rank()
    index = torch.tensor([cp_rank, 2 * cp_size - cp_rank - 1], device=pos_emb.device)
    pos_emb = pos_emb.view(*pos_emb.shape[:seq_dim], 2 * cp_size, -1, *pos_emb.shape[seq_dim + 1:])
    pos_emb = pos_emb.index_select(seq_dim, index)
    return pos_emb.view(*pos_emb.shape[:seq_dim], -1, *pos_emb.shape[seq_dim + 2:])
