"""megatron-core's GatedDeltaNet without flash-linear-attention (fla): torch versions of the three fla functions
it calls, for CPU.

``ssm/gated_delta_net/common.py`` imports ``causal_conv1d``, ``l2norm`` and ``chunk_gated_delta_rule`` from fla
(Triton kernels, CUDA only) and refuses to build a GatedDeltaNet without them (``HAVE_FLA``); its own torch
``torch_chunk_gated_delta_rule`` (for ``deterministic_mode``) takes no packed sequences. :func:`use_torch_gdn_kernels`
binds, in that module and in ``gdn.py`` (which imported the names), torch functions with fla's signatures:
the causal depthwise convolution and the chunked gated delta rule run per packed sequence (``cu_seqlens``;
the latter is megatron's own ``torch_chunk_gated_delta_rule``, HF transformers' reference). Slow, exact: for
CPU runs and tests; a GPU run needs fla.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from megarl.compat.shim import Shim, source_has

__all__ = ["SHIMS", "use_torch_gdn_kernels"]

_COMMON = "megatron.core.ssm.gated_delta_net.common"
SHIMS = (
    Shim("megatron.core.ssm.gated_delta_net without fla", ("megatron-core==0.19.2",), ("cpu",),
         "ssm/gated_delta_net/common.py:43 imports causal_conv1d / l2norm / chunk_gated_delta_rule from fla (Triton, "
         "CUDA) and GatedDeltaNet raises without it; use_torch_gdn_kernels binds torch versions on CPU",
         source_has(_COMMON, None, "from fla.ops.gated_delta_rule import chunk_gated_delta_rule")),
)


def _sequences(cu_seqlens: torch.Tensor | None, length: int) -> list[tuple[int, int]]:
    if cu_seqlens is None:
        return [(0, length)]
    bounds = cu_seqlens.tolist()
    return list(zip(bounds[:-1], bounds[1:]))


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, activation: str | None = None,
                  initial_state=None, output_final_state: bool = False, cu_seqlens: torch.Tensor | None = None, **_):
    """fla's ``causal_conv1d``: depthwise causal convolution of ``x`` ``[b, s, d]`` with ``weight`` ``[d, w]``
    (each packed sequence of ``cu_seqlens`` on its own), then ``activation``; returns ``(y [b, s, d], None)``."""
    if initial_state is not None or output_final_state:
        raise NotImplementedError("the torch causal_conv1d keeps no state (training forward only)")
    width = weight.shape[1]

    def conv(part: torch.Tensor) -> torch.Tensor:
        out = F.conv1d(part.transpose(1, 2), weight.unsqueeze(1), bias, padding=width - 1, groups=weight.shape[0])
        return out[..., : part.shape[1]].transpose(1, 2)

    y = torch.cat([conv(x[:, start:end]) for start, end in _sequences(cu_seqlens, x.shape[1])], dim=1)
    if activation in ("silu", "swish"):
        y = F.silu(y)
    elif activation is not None:
        raise ValueError(f"causal_conv1d activation {activation!r} is not supported (silu)")
    return y, None


def l2norm(x: torch.Tensor, eps: float = 1e-6, **_) -> torch.Tensor:
    """fla's ``l2norm`` over the last dim."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def chunk_gated_delta_rule(q, k, v, g, beta, initial_state=None, output_final_state: bool = False,
                           use_qk_l2norm_in_kernel: bool = False, cu_seqlens: torch.Tensor | None = None, **_):
    """fla's ``chunk_gated_delta_rule`` (q/k ``[b, s, h, dk]``, v ``[b, s, h, dv]``, g/beta ``[b, s, h]``) as
    megatron's ``torch_chunk_gated_delta_rule`` per packed sequence; returns ``(out [b, s, h, dv], None)``."""
    from megatron.core.ssm.gated_delta_net.common import torch_chunk_gated_delta_rule

    if initial_state is not None or output_final_state:
        raise NotImplementedError("the torch chunk_gated_delta_rule keeps no state (training forward only)")
    outs = [torch_chunk_gated_delta_rule(q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e],
                                         use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)[0]
            for s, e in _sequences(cu_seqlens, q.shape[1])]
    return torch.cat(outs, dim=1), None


def use_torch_gdn_kernels() -> None:
    """Bind the torch kernels above where megatron's GatedDeltaNet looks for fla's (idempotent)."""
    from megatron.core.ssm.gated_delta_net import common, gdn

    if common.HAVE_FLA and common.chunk_gated_delta_rule is not chunk_gated_delta_rule:
        return  # fla itself is installed
    for module in (common, gdn):
        for name, fn in (("causal_conv1d", causal_conv1d), ("chunk_gated_delta_rule", chunk_gated_delta_rule),
                         ("l2norm", l2norm)):
            if hasattr(module, name):
                setattr(module, name, fn)
    common.HAVE_FLA = True
