"""Loss aggregation `[batch, response_len] -> scalar`, micro-batch split invariant.

`agg_loss(..., global_denominator=D)` returns this micro-batch's share of the mini-batch
loss: summing it over every micro-batch (and data-parallel rank) of a mini-batch gives
exactly `agg_loss(whole mini-batch)`. `D` counts valid tokens (token-mean) or sequences
with at least one valid token (seq-mean-*) over the whole mini-batch on all DP ranks.
Pass either a number (in the unit of `loss_agg_mode`) or a `GlobalDenominator`, which
carries both counts so losses that force their own aggregation (geo_mean) still work.

Callers that back-propagate through a framework that averages over micro-batches or DP
ranks (Megatron divides by num_microbatches; DDP averages gradients) must undo that
scaling, since the shares here are meant to be summed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import torch

from megarl.algorithms.masked import masked_count, masked_sum
from megarl.algorithms.registry import check_choice
from megarl.config.names import LOSS_AGG_MODES
TOKEN_UNIT_MODES = ("token-mean",)
SEQ_UNIT_MODES = ("seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


@dataclass(frozen=True)
class GlobalDenominator:
    """Valid-token and valid-sequence counts over a whole mini-batch (all DP ranks)."""

    num_tokens: float
    num_seqs: float

    @classmethod
    def from_mask(cls, loss_mask: torch.Tensor) -> "GlobalDenominator":
        """Local counts of one `[batch, response_len]` mask (sum these, then all-reduce)."""
        return cls(
            num_tokens=float(masked_count(loss_mask)),
            num_seqs=float((masked_count(loss_mask, dim=-1) > 0).sum()),
        )

    def __add__(self, other: "GlobalDenominator") -> "GlobalDenominator":
        return GlobalDenominator(self.num_tokens + other.num_tokens, self.num_seqs + other.num_seqs)

    def to_tensor(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """`[2]` float64 tensor (num_tokens, num_seqs), e.g. to all-reduce (SUM) over DP ranks."""
        return torch.tensor([self.num_tokens, self.num_seqs], dtype=torch.float64, device=device)

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> "GlobalDenominator":
        num_tokens, num_seqs = t.tolist()
        return cls(num_tokens=num_tokens, num_seqs=num_seqs)

    def for_mode(self, loss_agg_mode: str) -> float | None:
        if loss_agg_mode in TOKEN_UNIT_MODES:
            return self.num_tokens
        if loss_agg_mode in SEQ_UNIT_MODES:
            return self.num_seqs
        return None


Denominator = Union[float, int, torch.Tensor, GlobalDenominator, None]


def resolve_denominator(global_denominator: Denominator, loss_agg_mode: str) -> float | torch.Tensor | None:
    """The number to divide by for `loss_agg_mode` (at least 1, so an all-masked
    mini-batch gives loss 0), or None for the local count."""
    denom = global_denominator
    if isinstance(denom, GlobalDenominator):
        denom = denom.for_mode(loss_agg_mode)
    if denom is None:
        return None
    if isinstance(denom, torch.Tensor):
        return denom.clamp_min(1.0)
    return max(float(denom), 1.0)


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    global_denominator: Denominator = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss into a scalar.

    Args:
        loss_mat: `[batch, response_len]` per-token loss.
        loss_mask: `[batch, response_len]`; 0 = ignored (values there never leak).
        loss_agg_mode (`actor.loss_agg_mode`):
            token-mean: sum of valid token losses / number of valid tokens.
            token-sum: sum of valid token losses (denominator unused).
            seq-mean-token-sum: mean over sequences of each sequence's token sum.
            seq-mean-token-mean: mean over sequences of each sequence's token mean.
            seq-mean-token-sum-norm: seq-mean-token-sum / loss_scale_factor.
            Sequences with no valid token are excluded from seq means.
        global_denominator: see module docstring; None = this batch's own count.
        loss_scale_factor (`actor.loss_scale_factor`): divisor for seq-mean-token-sum-norm;
            None = response_len (`loss_mask.shape[-1]`; keep it constant across
            micro-batches for split invariance).

    Returns: scalar tensor.
    """
    check_choice(loss_agg_mode, LOSS_AGG_MODES, "loss_agg_mode", "actor_rollout_ref.actor.loss_agg_mode")
    denom = resolve_denominator(global_denominator, loss_agg_mode)
    if loss_agg_mode == "token-mean":
        if denom is None:
            denom = masked_count(loss_mask).clamp_min(1.0)
        return masked_sum(loss_mat, loss_mask) / denom
    if loss_agg_mode == "token-sum":
        return masked_sum(loss_mat, loss_mask)

    token_count = masked_count(loss_mask, dim=-1)  # [batch]
    seq_valid = token_count > 0
    seq_sum = masked_sum(loss_mat, loss_mask, dim=-1)  # [batch]
    if loss_agg_mode == "seq-mean-token-mean":
        seq_loss = seq_sum / token_count.clamp_min(1.0)
    else:
        seq_loss = seq_sum
    if denom is None:
        denom = seq_valid.sum().to(torch.float32).clamp_min(1.0)
    loss = masked_sum(seq_loss, seq_valid) / denom
    if loss_agg_mode == "seq-mean-token-sum-norm":
        loss = loss / (loss_scale_factor if loss_scale_factor is not None else loss_mask.shape[-1])
    return loss


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Categorical entropy `[..., vocab] -> [...]` in nats: logsumexp(z) - sum(softmax(z) * z)."""
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def compute_entropy_loss(
    entropy: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    global_denominator: Denominator = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregated entropy (scalar) from per-token entropy `[batch, response_len]`.

    Use `entropy_from_logits` for the per-token values; the actor subtracts
    `entropy_coeff * this` from the policy loss (see `combine_actor_loss`).
    """
    return agg_loss(entropy, response_mask, loss_agg_mode, global_denominator, loss_scale_factor)


def combine_actor_loss(
    pg_loss: torch.Tensor,
    entropy_loss: torch.Tensor | None,
    entropy_coeff: float,
    kl_loss: torch.Tensor | None,
    kl_loss_coef: float,
) -> torch.Tensor:
    """Actor objective: pg_loss - entropy_coeff * entropy + kl_loss_coef * kl_loss.

    entropy_loss / kl_loss: None when not computed. Config: `actor.entropy_coeff`,
    `actor.kl_loss_coef` (KL only when `actor.use_kl_loss`).
    """
    loss = pg_loss
    if entropy_loss is not None and entropy_coeff != 0:
        loss = loss - entropy_coeff * entropy_loss
    if kl_loss is not None and kl_loss_coef != 0:
        loss = loss + kl_loss_coef * kl_loss
    return loss
