"""Masked reductions over `[batch, response_len]` tensors.

A mask is any tensor (bool/int/float) broadcastable to `values`; non-zero entries are
valid. Values at masked positions never influence a result, even when they are NaN/inf.
"""

from __future__ import annotations

import torch

_EPS = 1e-8


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `values` where `mask` is non-zero (over all elements, or along `dim`)."""
    valid = torch.where(mask.bool(), values, torch.zeros_like(values))
    return valid.sum() if dim is None else valid.sum(dim=dim)


def masked_count(mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Number of valid entries, as float."""
    m = mask.bool().to(torch.float32)
    return m.sum() if dim is None else m.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean over valid entries; 0 where there are none."""
    count = masked_count(mask, dim).to(values.dtype if values.is_floating_point() else torch.float32)
    return masked_sum(values, mask, dim) / count.clamp_min(1.0)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over all valid entries (Bessel-corrected when `unbiased`).

    Raises ValueError when fewer than 2 (unbiased) or 1 valid entries exist.
    """
    count = masked_count(mask)
    need = 2 if unbiased else 1
    if count < need:
        raise ValueError(f"masked_var needs at least {need} valid entries, got {int(count)}")
    mean = masked_mean(values, mask)
    var = masked_sum((values - mean) ** 2, mask) / count
    if unbiased:
        var = var * count / (count - 1)
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(values - mean) / sqrt(var + 1e-8) with batch statistics over valid entries.

    Returns the same shape as `values`; masked positions are set to 0.
    With `shift_mean=False` the mean is added back after scaling.
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    out = (values - mean) * torch.rsqrt(var + _EPS)
    if not shift_mean:
        out = out + mean
    return torch.where(mask.bool(), out, torch.zeros_like(out))
