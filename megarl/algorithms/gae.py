"""Return-based estimators: GAE and REINFORCE++ (discounted returns), vectorized.

Masked (observation / padding) positions are skipped the way a token-by-token loop that
carries its state across them would do: their rewards and values never enter, and the
discounting runs over valid tokens only. Outputs are 0 at masked positions.
"""

from __future__ import annotations

import torch


def reverse_linear_scan(coef: torch.Tensor, inp: torch.Tensor) -> torch.Tensor:
    """Solve x_t = inp_t + coef_t * x_{t+1} (x_T = 0) along the last dim.

    Hillis-Steele doubling: ceil(log2 T) elementwise passes, no division, so it is stable
    for any coef (products only ever multiply). `[..., T]` -> `[..., T]`.
    """
    x = inp.clone()
    a = coef.clone()
    T = x.shape[-1]
    shift = 1
    while shift < T:
        # x_t += a_t * x_{t+shift}; a_t *= a_{t+shift} (zero beyond the end)
        x_next = torch.nn.functional.pad(x[..., shift:], (0, shift))
        a_next = torch.nn.functional.pad(a[..., shift:], (0, shift))
        x = x + a * x_next
        a = a * a_next
        shift *= 2
    return x


def _next_valid(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """For each t, values at the next valid position after t (0 if none)."""
    m = mask.to(values.dtype)
    shifted_m = torch.nn.functional.pad(m[..., 1:], (0, 1))
    shifted_v = torch.nn.functional.pad(values[..., 1:], (0, 1))
    # y_t = m_{t+1} v_{t+1} + (1 - m_{t+1}) y_{t+1}
    return reverse_linear_scan(1.0 - shifted_m, shifted_m * shifted_v)


def gae_advantages_returns(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw (un-whitened) GAE.

    delta_t = r_t + gamma * V_next(t) - V_t, A_t = delta_t + gamma * lam * A_next(t),
    where "next" is the next valid token (V = 0 past the last one).

    Args: token_level_rewards, values, response_mask: `[batch, response_len]`.
    Returns: advantages, returns (= advantages + values), `[batch, response_len]`, 0 where masked.
    """
    with torch.no_grad():
        rewards = token_level_rewards.float()
        vals = values.float()
        m = response_mask.bool()
        mf = m.to(rewards.dtype)
        rewards = torch.where(m, rewards, torch.zeros_like(rewards))
        vals = torch.where(m, vals, torch.zeros_like(vals))
        next_values = _next_valid(vals, m)
        delta = rewards + gamma * next_values - vals
        advantages = reverse_linear_scan(mf * (gamma * lam) + (1.0 - mf), mf * delta) * mf
        returns = (advantages + vals) * mf
    return advantages, returns


def discounted_returns(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_next(t) over valid tokens; `[batch, response_len]`, 0 where masked."""
    with torch.no_grad():
        m = response_mask.bool()
        mf = m.to(torch.float32)
        rewards = torch.where(m, token_level_rewards.float(), torch.zeros_like(mf))
        return reverse_linear_scan(mf * gamma + (1.0 - mf), rewards) * mf
