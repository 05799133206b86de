"""Log-probs and entropy from tensor-parallel (vocab-sharded) logits.

Each tensor-parallel rank holds logits for a contiguous slice of the vocabulary
(`[..., vocab / tp]`, megatron's `ColumnParallelLinear` output layer with
`parallel_output=True`). The full vocabulary is never gathered: two small all-reduces
over the TP group give the max, then (stacked) the target logit, the partition
function, the entropy's sum and, when asked, sum_v e_v^2 (for sum_v pi_v^2, the optimal
token baseline's input).

Gradients are written by hand (`_LogProbEntropy`): each TP rank's slice gets its part of
the gradient of the reduced loss, which every TP rank computes identically, so the
backward needs no communication. Logits of vocab padding rows may be `-inf` (megarl
masks them): they contribute zero probability and no NaN.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import parallel_state

__all__ = ["vocab_parallel_log_probs", "vocab_parallel_log_probs_and_entropy", "vocab_parallel_token_stats"]


def _local_vocab_start(local_vocab: int, tp_group) -> int:
    return dist.get_rank(group=tp_group) * local_vocab if tp_group.size() > 1 else 0


def vocab_parallel_log_probs_and_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    *,
    temperature: float = 1.0,
    compute_entropy: bool = True,
    tp_group=None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log pi(target) and entropy of softmax(logits / temperature).

    Args:
        logits: `[..., vocab / tp]` this rank's vocabulary slice (any float dtype;
            computed in fp32).
        target: `[...]` int64 token ids in the full (padded) vocabulary.
        temperature: sampling temperature; logits are divided by it first, as the rollout
            engine does before sampling.
        compute_entropy: skip the entropy (returns None) when False.
        tp_group: tensor-parallel group; default megatron's.

    Returns:
        (log_probs `[...]`, entropy `[...]` in nats or None), identical on every TP rank,
        differentiable w.r.t. `logits`.
    """
    log_probs, entropy, _ = vocab_parallel_token_stats(
        logits, target, temperature=temperature, compute_entropy=compute_entropy, tp_group=tp_group
    )
    return log_probs, entropy


def vocab_parallel_token_stats(
    logits: torch.Tensor,
    target: torch.Tensor,
    *,
    temperature: float = 1.0,
    compute_entropy: bool = True,
    compute_sum_pi_squared: bool = False,
    tp_group=None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """`vocab_parallel_log_probs_and_entropy` plus, when `compute_sum_pi_squared`,
    sum_v pi_v^2 `[...]` of softmax(logits / temperature) (fp32, not differentiable; None
    otherwise). Each TP rank sums its vocabulary slice; the sum joins the one stacked
    all-reduce of the log-prob pass (no extra collective, no gathered vocabulary).

    Returns: (log_probs `[...]`, entropy `[...]` or None, sum_pi_squared `[...]` or None).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    tp_group = tp_group if tp_group is not None else parallel_state.get_tensor_model_parallel_group()
    log_probs, entropy, sum_pi_squared = _LogProbEntropy.apply(
        logits, target, float(temperature), bool(compute_entropy), bool(compute_sum_pi_squared), tp_group
    )
    return (log_probs, entropy if compute_entropy else None, sum_pi_squared if compute_sum_pi_squared else None)


class _LogProbEntropy(torch.autograd.Function):
    """Fused vocab-parallel log pi(target) and entropy (forward and backward by hand).

    One fp32 copy of the logits is shifted in place; `e = exp(x - max)` (in place too when
    no entropy is asked for) is kept unnormalised and becomes the gradient buffer, so the
    softmax normalisation folds into the backward's one multiply. The entropy keeps the
    shifted logits as a second buffer. Autograd through the elementwise chain held ~5
    fp32 copies of `[tokens, vocab / tp]` and ran ~3x the memory passes. Gradients
    (x = logits / T, shifted; p = e / S, S = sum e; H = entropy):
        d log p_t / dx_j = [j == t] - p_j
        dH / dx_j        = -p_j (x_j - log S + H)
    sum_v p_v^2 = (sum_v e_v^2) / S^2 is an output without gradient.
    """

    @staticmethod
    def forward(ctx, logits, target, temperature, compute_entropy, compute_sum_pi_squared, tp_group):
        ctx.set_materialize_grads(False)
        x = logits.float()
        if x.data_ptr() == logits.data_ptr():
            x = x.clone()
        if temperature != 1.0:
            x.div_(temperature)
        local_vocab = x.shape[-1]
        vocab_start = _local_vocab_start(local_vocab, tp_group)
        tp = tp_group.size()

        shift = x.max(dim=-1, keepdim=True).values
        if tp > 1:
            dist.all_reduce(shift, op=dist.ReduceOp.MAX, group=tp_group)
        x.sub_(shift)  # <= 0; -inf on masked vocab rows
        local_target = target - vocab_start
        in_slice = (local_target >= 0) & (local_target < local_vocab)
        index = local_target.clamp(0, local_vocab - 1).unsqueeze(-1)
        target_logit = x.gather(-1, index).squeeze(-1).masked_fill(~in_slice, 0.0)

        if compute_entropy:
            x.clamp_(min=-1e20)  # e * x must be 0, not NaN, where e == 0
            e = x.exp()
            parts = [target_logit, e.sum(dim=-1), torch.linalg.vecdot(e, x)]
        else:
            e = x.exp_()  # x is not needed any more
            parts = [target_logit, e.sum(dim=-1)]
        if compute_sum_pi_squared:
            parts.append(torch.linalg.vecdot(e, e))  # e <= 1 after the max shift: no overflow
        sums = torch.stack(parts)
        if tp > 1:
            dist.all_reduce(sums, group=tp_group)
        sum_exp = sums[1]
        log_z = sum_exp.log()
        log_probs = sums[0] - log_z
        entropy = log_z - sums[2] / sum_exp if compute_entropy else torch.zeros_like(log_z)
        sum_pi_squared = sums[-1] / sum_exp.square() if compute_sum_pi_squared else torch.zeros_like(log_z)
        ctx.mark_non_differentiable(sum_pi_squared)

        ctx.temperature, ctx.compute_entropy, ctx.dtype = temperature, compute_entropy, logits.dtype
        saved = (e, index, in_slice, sum_exp, log_z, entropy) + ((x,) if compute_entropy else ())
        ctx.save_for_backward(*saved)
        return log_probs, entropy, sum_pi_squared

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy, _grad_sum_pi_squared):
        e, index, in_slice, sum_exp, log_z, entropy, *rest = ctx.saved_tensors
        g_lp = grad_log_probs if grad_log_probs is not None else torch.zeros_like(log_z)
        if ctx.compute_entropy and grad_entropy is not None:
            (x,) = rest
            # grad = e * (-(g_lp / S) - (g_H / S) * (x - log S + H)), built in x's buffer
            grad = x.sub_((log_z - entropy).unsqueeze(-1)).mul_((-grad_entropy / sum_exp).unsqueeze(-1))
            grad.sub_((g_lp / sum_exp).unsqueeze(-1)).mul_(e)
        else:
            grad = e.mul_((-g_lp / sum_exp).unsqueeze(-1))
        grad.scatter_add_(-1, index, (g_lp * in_slice).unsqueeze(-1))
        if ctx.temperature != 1.0:
            grad.div_(ctx.temperature)
        return grad.to(ctx.dtype), None, None, None, None, None


def vocab_parallel_log_probs(
    logits: torch.Tensor, target: torch.Tensor, *, temperature: float = 1.0, tp_group=None
) -> torch.Tensor:
    """`vocab_parallel_log_probs_and_entropy` without the entropy: `[...]`."""
    return vocab_parallel_log_probs_and_entropy(
        logits, target, temperature=temperature, compute_entropy=False, tp_group=tp_group
    )[0]
