"""Run megatron-core 0.16.1 on CPU (gloo): the few places that assume CUDA.

Applied by :func:`megarl.parallel.init_distributed` only when the device is CPU (the
last item below also on GPUs without transformer-engine). Everything megatron needs beyond this (SDPA core attention instead of the
default ``DotProductAttention``, ``use_cpu_initialization``, the ``allgather`` MoE
dispatcher, seeding without ``model_parallel_cuda_manual_seed``) is chosen in
``megarl.models`` / ``megarl.parallel`` rather than patched here.

What it changes, process-wide, and why:

* ``torch.cuda.current_device()`` returns ``torch.device("cpu")``: megatron allocates
  p2p shape buffers, grad buffers and router/expert tensors with
  ``device=torch.cuda.current_device()``. Without CUDA that call would raise.
* ``torch.cuda.synchronize()`` is a no-op (p2p communication, DDP, parallel_state).
* ``megatron.core.pipeline_parallel.schedules.torch`` is a thin proxy of ``torch`` whose
  ``zeros``/``empty``/``tensor`` map ``device="cuda"`` to CPU (the schedules allocate
  ``total_num_tokens`` with a literal ``device="cuda"``).
* ``LanguageModule.setup_embeddings_and_output_layer`` runs with ``Tensor.cuda`` as
  the identity: with tied embeddings and PP > 1 it moves the last stage's embedding
  copy to CUDA before the first/last-stage all-reduce.
* RoPE under context parallelism: ``get_pos_emb_on_this_cp_rank`` (the rotary embeddings of
  this CP rank's two chunks) builds its chunk index in pinned memory and moves it with
  ``.cuda()``; the rotary modules get the same selection with the index on the embedding's device.
* ``megatron.core.transformer.moe.moe_utils.te_general_gemm = None`` when
  transformer-engine is absent (0.16.1 references it unguarded in the router gemm), and
  ``multi_latent_attention.HAVE_TE = False`` when its ``TELinear`` is no class (its TE import
  succeeds without TE, binding a MagicMock); these, :func:`apply_missing_te_compat`, are also applied on GPUs without TE.
"""

from __future__ import annotations

import contextlib
import functools
import types

import torch

_APPLIED = False


def _cpu_if_cuda(kwargs: dict) -> dict:
    device = kwargs.get("device")
    if device is not None and torch.device(device).type == "cuda":
        kwargs["device"] = "cpu"
    return kwargs


class _TorchCudaToCpu(types.ModuleType):
    """``torch`` as seen by one megatron module: ``device="cuda"`` allocations go to CPU."""

    def __init__(self) -> None:
        super().__init__("torch")

    def __getattr__(self, name: str):
        return getattr(torch, name)

    @staticmethod
    def zeros(*args, **kwargs):
        return torch.zeros(*args, **_cpu_if_cuda(kwargs))

    @staticmethod
    def empty(*args, **kwargs):
        return torch.empty(*args, **_cpu_if_cuda(kwargs))

    @staticmethod
    def tensor(*args, **kwargs):
        return torch.tensor(*args, **_cpu_if_cuda(kwargs))


@contextlib.contextmanager
def _tensor_cuda_is_identity():
    original = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    try:
        yield
    finally:
        torch.Tensor.cuda = original


def _without_cuda_moves(method):
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        with _tensor_cuda_is_identity():
            return method(*args, **kwargs)

    return wrapper


# Public name for other CPU shims (e.g. the optimizer's) that redirect a module's torch.
TorchCudaToCpu = _TorchCudaToCpu


def apply_cpu_compat() -> None:
    """Install the CPU shims above (idempotent). Call only for CPU runs."""
    global _APPLIED
    if _APPLIED:
        return
    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.cuda.synchronize = lambda device=None: None

    from megatron.core.models.common.language_module.language_module import LanguageModule
    from megatron.core.pipeline_parallel import schedules

    schedules.torch = _TorchCudaToCpu()
    # Sequence-parallel regions (the embedding's dropout) fork megatron's CUDA RNG tracker, which
    # CPU runs never seed (model_parallel_cuda_manual_seed asserts CUDA): run them on the CPU
    # generator instead.
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker

    CudaRNGStatesTracker.fork = lambda self, name=None: contextlib.nullcontext()
    LanguageModule.setup_embeddings_and_output_layer = _without_cuda_moves(
        LanguageModule.setup_embeddings_and_output_layer
    )
    from megatron.core.models.common.embeddings import rotary_pos_embedding, yarn_rotary_pos_embedding

    rotary_pos_embedding.get_pos_emb_on_this_cp_rank = _pos_emb_on_this_cp_rank
    yarn_rotary_pos_embedding.get_pos_emb_on_this_cp_rank = _pos_emb_on_this_cp_rank
    apply_missing_te_compat()
    _APPLIED = True


def _pos_emb_on_this_cp_rank(pos_emb: torch.Tensor, seq_dim: int, cp_group) -> torch.Tensor:
    """megatron's ``rope_utils.get_pos_emb_on_this_cp_rank`` with its chunk index on ``pos_emb``'s
    device: of the ``2 * cp`` chunks along ``seq_dim``, chunks ``r`` and ``2 * cp - 1 - r``."""
    cp_size, cp_rank = cp_group.size(), cp_group.rank()
    index = torch.tensor([cp_rank, 2 * cp_size - cp_rank - 1], device=pos_emb.device)
    pos_emb = pos_emb.view(*pos_emb.shape[:seq_dim], 2 * cp_size, -1, *pos_emb.shape[seq_dim + 1:])
    pos_emb = pos_emb.index_select(seq_dim, index)
    return pos_emb.view(*pos_emb.shape[:seq_dim], -1, *pos_emb.shape[seq_dim + 2:])


def apply_missing_te_compat() -> None:
    """``moe_utils.te_general_gemm = None`` and MLA's ``HAVE_TE = False`` when transformer-engine
    is absent (CPU or GPU).

    megatron-core 0.16.1 only binds that name when TE imports, but the MoE router reads
    it unguarded; without this a MoE forward raises ``NameError``.
    """
    from megatron.core.transformer import multi_latent_attention
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    # Its TE import succeeds without TE (the extension module binds TELinear to a MagicMock), so
    # MLA's ``isinstance(..., TELinear)`` check would raise: mark TE absent there.
    if not isinstance(multi_latent_attention.TELinear, type):
        multi_latent_attention.HAVE_TE = False
