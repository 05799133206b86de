"""Critic loss and the explained-variance metric."""

from __future__ import annotations

import torch

from megarl.algorithms.agg import Denominator, agg_loss
from megarl.algorithms.masked import masked_mean, masked_var


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str,
    global_denominator: Denominator = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, float]:
    """Clipped value loss 0.5 * agg(max((v - R)^2, (clip(v, V_old +- c) - R)^2)).

    Args: vpreds (new predictions, with grad), returns, values (old predictions):
        `[batch, response_len]`; cliprange_value (`critic.cliprange_value`);
        loss_agg_mode (`critic.loss_agg_mode`).
    Returns: (vf_loss scalar, vf_clipfrac = fraction of valid tokens where the clipped term is larger).
    """
    vclipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    loss_unclipped = (vpreds - returns) ** 2
    loss_clipped = (vclipped - returns) ** 2
    loss = 0.5 * agg_loss(
        torch.maximum(loss_unclipped, loss_clipped), response_mask, loss_agg_mode, global_denominator, loss_scale_factor
    )
    clipfrac = masked_mean((loss_clipped > loss_unclipped).float(), response_mask).item()
    return loss, clipfrac


def explained_variance(values: torch.Tensor, returns: torch.Tensor, response_mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over valid tokens (1 = perfect critic).

    Returns nan when returns have zero variance.
    """
    var_returns = masked_var(returns.float(), response_mask)
    if var_returns == 0:
        return float("nan")
    return (1.0 - masked_var((returns - values).float(), response_mask) / var_returns).item()
