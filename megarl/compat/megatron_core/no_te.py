"""megatron-core where transformer-engine is absent (CPU, or GPUs without TE).

:func:`apply_no_te` is applied by :func:`megarl.parallel.init_distributed` on every device (on
CPU through :func:`megarl.compat.megatron_core.cpu.apply_cpu`).
"""

from __future__ import annotations

from megarl.compat.shim import Shim

__all__ = ["SHIMS", "apply_no_te"]


def _router_gemm_unbound() -> bool:
    from megatron.core.transformer.moe import moe_utils

    return _SET_TE_GENERAL_GEMM or not hasattr(moe_utils, "te_general_gemm")


def _mla_te_linear_is_mock() -> bool:
    from megatron.core.transformer import multi_latent_attention

    return not isinstance(multi_latent_attention.TELinear, type | None)


SHIMS = (
    Shim("megatron.core.transformer.moe.moe_utils.te_general_gemm", ("megatron-core==0.16.1",), ("cpu", "gpu"),
         "0.16.1 binds te_general_gemm only when TE imports (moe_utils.py:22-39) but the MoE router reads it "
         "unguarded (:1192): without TE a MoE forward raises NameError; bound to None",
         _router_gemm_unbound),
    Shim("megatron.core.transformer.multi_latent_attention.HAVE_TE", ("megatron-core==0.16.1",), ("cpu", "gpu"),
         "its TE import succeeds without TE (the extension module binds TELinear to a MagicMock), so MLA's "
         "isinstance(..., TELinear) check (:185) would raise: HAVE_TE = False there",
         _mla_te_linear_is_mock),
)

_SET_TE_GENERAL_GEMM = False


def apply_no_te() -> None:
    """The :data:`SHIMS` above, where they apply (idempotent; a no-op with TE installed)."""
    global _SET_TE_GENERAL_GEMM
    from megatron.core.transformer import multi_latent_attention
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
        _SET_TE_GENERAL_GEMM = True
    if not isinstance(multi_latent_attention.TELinear, type):
        multi_latent_attention.HAVE_TE = False
