"""Return-based estimators: GAE and discounted returns (REINFORCE++, ReMax, OTB), vectorized.

Masked (observation / padding) positions are skipped the way a token-by-token loop that
carries its state across them would do: their rewards and values never enter, and the
discounting runs over valid tokens only. Outputs are 0 at masked positions.

How: valid tokens of each row are packed to the left (an O(batch * len) scatter; skipped
for right-padded masks), which turns any mask into a right-padded one with a constant
discount; the reverse discounted
cumsum is then two small matmuls over chunks of `_CHUNK` positions (no division, so it
is stable for any discount in [0, 1]), and the result is gathered back.
"""

from __future__ import annotations

import torch

_CHUNK = 64


def _discount_matrix(n: int, c: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """M[j, i] = c^(j - i) for j >= i else 0, so (x @ M)[i] = sum_{j >= i} c^(j-i) x_j."""
    idx = torch.arange(n, device=device)
    diff = (idx[:, None] - idx[None, :]).to(dtype)
    powers = torch.pow(torch.tensor(c, dtype=dtype, device=device), diff.clamp_min(0))
    return torch.where(diff >= 0, powers, torch.zeros_like(powers))


def reverse_discounted_cumsum(x: torch.Tensor, c: float) -> torch.Tensor:
    """y_t = sum_{s >= t} c^(s - t) x_s along the last dim of `[batch, T]` (c in [0, 1])."""
    B, T = x.shape
    if T == 0:
        return x.clone()
    k = min(_CHUNK, T)
    n = -(-T // k)
    # float64 on GPUs so TF32 matmul settings cannot degrade it; CPU float32 matmul is exact enough.
    dtype = torch.float32 if x.device.type == "cpu" else torch.float64
    xp = torch.nn.functional.pad(x.to(dtype), (0, n * k - T)).view(B, n, k)
    local = xp @ _discount_matrix(k, c, dtype, x.device)  # [B, n, k], within-chunk sums
    # Value at the start of each chunk including everything after it: a scan over chunks
    # with discount c^k, again a matmul.
    starts = local[:, :, 0] @ _discount_matrix(n, c**k, dtype, x.device)  # [B, n]
    carry = torch.nn.functional.pad(starts[:, 1:], (0, 1))  # start of the next chunk
    base = torch.tensor(c, dtype=dtype, device=x.device)
    tail = torch.pow(base, torch.arange(k, 0, -1, device=x.device, dtype=dtype))
    local.addcmul_(carry.unsqueeze(-1), tail)  # + c^(k - i) * next chunk's start
    return local.view(B, n * k)[:, :T].to(x.dtype)


def _pack_left(mask: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
    """For each valid token its column after packing valid tokens to the left; masked
    tokens go to a spare column T. Returns (dest `[batch, T]`, or None when the mask is
    already right-padded so no packing is needed; mask as bool)."""
    m = mask.bool()
    if bool((m[:, 1:] <= m[:, :-1]).all()):
        return None, m
    dest = (torch.cumsum(m.float(), dim=-1) - 1).long()  # float cumsum: much faster on CPU, exact < 2^24
    return torch.where(m, dest, torch.full_like(dest, m.shape[-1])), m


def _packed(values: torch.Tensor, dest: torch.Tensor | None) -> torch.Tensor:
    if dest is None:
        return values
    out = torch.zeros(values.shape[0], values.shape[1] + 1, dtype=values.dtype, device=values.device)
    return out.scatter_(1, dest, values)[:, :-1]


def _unpacked(packed: torch.Tensor, dest: torch.Tensor | None, m: torch.Tensor) -> torch.Tensor:
    """Back to the original columns (masked positions 0); may reuse `packed`'s storage."""
    if dest is None:
        return packed.mul_(m)
    padded = torch.nn.functional.pad(packed, (0, 1))
    return torch.gather(padded, 1, dest).mul_(m)


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

    Args: token_level_rewards, values, response_mask: `[batch, response_len]`; gamma, lam in [0, 1].
    Returns: advantages, returns (= advantages + values), float32 `[batch, response_len]`, 0 where masked.
    """
    with torch.no_grad():
        dest, m = _pack_left(response_mask)
        v_masked = torch.where(m, values.float(), 0.0)
        v = _packed(v_masked, dest)
        # delta = r + gamma * V_next - V; packed rows end in zeros, so V = 0 past the end
        # and delta = 0 there. In-place ops: these tensors are large.
        delta = torch.nn.functional.pad(v[:, 1:], (0, 1)).mul_(gamma)
        delta.add_(_packed(torch.where(m, token_level_rewards.float(), 0.0), dest)).sub_(v)
        advantages = _unpacked(reverse_discounted_cumsum(delta, gamma * lam), dest, m)
        returns = v_masked.add_(advantages)  # 0 where masked: both terms are
    return advantages, returns


def discounted_returns(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_next(t) over valid tokens; float32 `[batch, response_len]`, 0 where masked."""
    with torch.no_grad():
        dest, m = _pack_left(response_mask)
        r = _packed(torch.where(m, token_level_rewards.float(), 0.0), dest)
        return _unpacked(reverse_discounted_cumsum(r, gamma), dest, m)
