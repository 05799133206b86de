"""megatron-core's MambaMixer without mamba-ssm / causal-conv1d: torch versions of what its training forward
calls, for CPU.

``ssm/mamba_mixer.py`` imports ``mamba_split_conv1d_scan_combined`` and the gated ``RMSNorm`` from mamba-ssm
(Triton, CUDA) and refuses to build a MambaMixer without them (``HAVE_MAMBA_SSM``; its ``ExtendedRMSNorm``
then subclasses a ``MagicMock``); its packed-sequence check (``_check_mamba_sequence_packing_support``) reads
the installed mamba-ssm / causal-conv1d versions. :func:`use_torch_mamba_kernels` binds, in that module:

* ``mamba_split_conv1d_scan_combined``: mamba-ssm's fused training op with its signature (``[b, l, 2*d_inner +
  2*groups*state + heads]`` in: ``z | x B C | dt``), the causal depthwise convolution and the chunked SSD scan
  run per packed sequence (``seq_idx``), ``y * silu(z)`` out; ``dt_limit`` (0, inf) as megatron passes none;
* ``ExtendedRMSNorm``: mamba-ssm's gated group RMSNorm (``norm_before_gate=False``; megatron calls it without
  a gate, the gate being applied in the scan), with megatron's TP-sharded ``sharded_state_dict``;
* ``_check_mamba_sequence_packing_support``: packing is supported (the ops above split by ``seq_idx``).

Exact in fp32, slow: for CPU runs and tests; a GPU run needs mamba-ssm and causal-conv1d.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from megarl.compat.shim import Shim, source_has

__all__ = ["SHIMS", "GatedRMSNorm", "mamba_split_conv1d_scan_combined", "use_torch_mamba_kernels"]

_MIXER = "megatron.core.ssm.mamba_mixer"
SHIMS = (
    Shim("megatron.core.ssm.mamba_mixer without mamba-ssm", ("megatron-core==0.19.2",), ("cpu",),
         "ssm/mamba_mixer.py:66 imports RMSNormGated / mamba_split_conv1d_scan_combined from mamba-ssm (Triton, "
         "CUDA), MambaMixer raises without it and _check_mamba_sequence_packing_support reads its version; "
         "use_torch_mamba_kernels binds torch versions on CPU",
         source_has(_MIXER, None, "from mamba_ssm.ops.triton.ssd_combined import")),
)


def _segments(seq_idx: torch.Tensor | None, length: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each packed sequence of ``seq_idx`` ``[1, l]`` (one per run of equal ids)."""
    if seq_idx is None:
        return [(0, length)]
    ids = seq_idx[0].tolist()
    starts = [0] + [t for t in range(1, length) if ids[t] != ids[t - 1]]
    return list(zip(starts, starts[1:] + [length]))


def _ssd_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
              chunk_size: int) -> torch.Tensor:
    """The Mamba-2 SSD recurrence ``h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t``, ``y_t = C_t h_t`` from a zero
    state, in chunks (quadratic inside a chunk, the state carried across): x ``[b, l, h, p]``, dt ``[b, l, h]``
    (discretised), A ``[h]``, B / C ``[b, l, h, n]``; returns y ``[b, l, h, p]`` in fp32."""
    b, length, heads, p = x.shape
    pad = -length % chunk_size
    xdt = F.pad(x * dt[..., None], (0, 0, 0, 0, 0, pad))
    a = F.pad(dt * A, (0, 0, 0, pad))
    B, C = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (B, C))
    chunks = (length + pad) // chunk_size
    xdt, B, C = (t.reshape(b, chunks, chunk_size, heads, -1) for t in (xdt, B, C))
    acum = a.reshape(b, chunks, chunk_size, heads).cumsum(dim=2)  # [b, c, l, h]
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=x.device).tril()
    decay = (acum[:, :, :, None] - acum[:, :, None]).masked_fill(~causal[None, None, :, :, None], float("-inf"))
    y = torch.einsum("bclhn,bcshn,bclsh,bcshp->bclhp", C, B, decay.exp(), xdt)
    # chunk c's own contribution to the state at its end, then the state entering each chunk
    into_state = torch.einsum("bclhn,bclh,bclhp->bchpn", B, (acum[:, :, -1:] - acum).exp(), xdt)
    state = x.new_zeros(b, heads, p, B.shape[-1])
    starts = []
    for c in range(chunks):
        starts.append(state)
        state = state * acum[:, c, -1, :, None, None].exp() + into_state[:, c]
    y = y + torch.einsum("bclhn,bchpn,bclh->bclhp", C, torch.stack(starts, dim=1), acum.exp())
    return y.reshape(b, chunks * chunk_size, heads, p)[:, :length]


def mamba_split_conv1d_scan_combined(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
                                     initial_states=None, seq_idx=None, dt_limit=(0.0, float("inf")),
                                     return_final_states=False, activation="silu", rmsnorm_weight=None,
                                     rmsnorm_eps=1e-6, outproj_weight=None, outproj_bias=None, headdim=None,
                                     ngroups=1, norm_before_gate=True, **_):
    """mamba-ssm's ``mamba_split_conv1d_scan_combined`` as megatron's ``MambaMixer._ssm_training`` calls it
    (no rmsnorm / out projection fused, no initial or final state): ``zxbcdt`` ``[b, l, d]`` -> ``[b, l, d_inner]``."""
    if initial_states is not None or return_final_states or rmsnorm_weight is not None or outproj_weight is not None:
        raise NotImplementedError("the torch mamba_split_conv1d_scan_combined keeps no state and fuses no "
                                  "norm / out projection (megatron's training forward)")
    if activation not in ("silu", "swish"):
        raise ValueError(f"mamba activation {activation!r} is not supported (silu)")
    heads = dt_bias.shape[0]
    d_inner = heads * headdim
    state = (zxbcdt.shape[-1] - 2 * d_inner - heads) // (2 * ngroups)
    z, xbc, dt = torch.split(zxbcdt, [d_inner, d_inner + 2 * ngroups * state, heads], dim=-1)
    width = conv1d_weight.shape[-1]
    outs = []
    for start, end in _segments(seq_idx, zxbcdt.shape[1]):
        part = xbc[:, start:end].transpose(1, 2)
        conv = F.conv1d(part, conv1d_weight[:, None], conv1d_bias, padding=width - 1, groups=part.shape[1])
        x, B, C = torch.split(F.silu(conv[..., : end - start]).transpose(1, 2), [d_inner, ngroups * state,
                                                                                  ngroups * state], dim=-1)
        b, length = x.shape[:2]
        B, C = (t.reshape(b, length, ngroups, state).repeat_interleave(heads // ngroups, dim=2).float() for t in (B, C))
        step = F.softplus(dt[:, start:end].float() + dt_bias.float()).clamp(*dt_limit)
        x = x.reshape(b, length, heads, headdim)
        y = _ssd_scan(x.float(), step, A.float(), B, C, chunk_size) + D.float()[:, None] * x.float()
        outs.append(y.reshape(b, length, d_inner))
    return (torch.cat(outs, dim=1) * F.silu(z.float())).to(zxbcdt.dtype)


class GatedRMSNorm(torch.nn.Module):
    """mamba-ssm's ``RMSNorm`` (``layernorm_gated``): RMS-normalise each ``group_size`` channels of
    ``x * silu(z)`` (gate first: ``norm_before_gate=False``), scale by ``weight``; megatron's
    ``ExtendedRMSNorm`` with its TP-sharded checkpoint entry (``weight`` along dim 0)."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, group_size: int | None = None,
                 norm_before_gate: bool = True, device=None, dtype=None):
        super().__init__()
        if norm_before_gate:
            raise NotImplementedError("the torch gated RMSNorm normalises after the gate (megatron's MambaMixer)")
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.eps, self.group_size = eps, group_size or hidden_size

    def forward(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        dtype = x.dtype
        x = x.float() if z is None else x.float() * F.silu(z.float())
        grouped = x.reshape(*x.shape[:-1], -1, self.group_size)
        grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)
        return (grouped.reshape(x.shape) * self.weight.float()).to(dtype)

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        """``weight`` split along dim 0 over ``tp_group`` (set by the MambaMixer), as ``ExtendedRMSNorm``'s."""
        from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group, make_sharded_tensors_for_checkpoint

        metadata = ensure_metadata_has_dp_cp_group(metadata)
        return make_sharded_tensors_for_checkpoint(self.state_dict(prefix="", keep_vars=True), prefix, {"weight": 0},
                                                   sharded_offsets, tp_group=self.tp_group,
                                                   dp_cp_group=metadata["dp_cp_group"])


def use_torch_mamba_kernels() -> None:
    """Bind the torch ops above where megatron's MambaMixer looks for mamba-ssm's (idempotent)."""
    from megatron.core.ssm import mamba_mixer

    if mamba_mixer.HAVE_MAMBA_SSM and mamba_mixer.mamba_split_conv1d_scan_combined is not mamba_split_conv1d_scan_combined:
        return  # mamba-ssm itself is installed
    mamba_mixer.mamba_split_conv1d_scan_combined = mamba_split_conv1d_scan_combined
    mamba_mixer.ExtendedRMSNorm = GatedRMSNorm
    mamba_mixer._check_mamba_sequence_packing_support = lambda for_inference_not_training=True: (True, None)
    mamba_mixer.HAVE_MAMBA_SSM = True
