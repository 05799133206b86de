"""Top-k log-probs and the top-k forward KL from tensor-parallel (vocab-sharded) logits, for
on-policy distillation (megarl.algorithms.distillation).

Each TP rank holds logits for a contiguous slice of the vocabulary (`[..., vocab / tp]`); the
full vocabulary is never gathered. The teacher's top-k: each rank's own top-k candidates (global
ids), all-gathered (`tp x k` per token) and cut to k. The student's KL against those k: each rank
reads the teacher ids inside its slice and one all-reduce sums the parts; the backward is written
by hand and needs no communication (every TP rank holds the same reduced loss).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import parallel_state

__all__ = ["vocab_parallel_topk_log_probs", "vocab_parallel_forward_kl_topk"]


def _group(tp_group):
    return tp_group if tp_group is not None else parallel_state.get_tensor_model_parallel_group()


def _log_softmax(logits: torch.Tensor, temperature: float, tp_group) -> torch.Tensor:
    """fp32 log softmax(logits / temperature) of this rank's slice `[..., vocab / tp]` over the full vocabulary."""
    x = logits.float() / temperature
    shift = x.max(dim=-1, keepdim=True).values
    if tp_group.size() > 1:
        dist.all_reduce(shift, op=dist.ReduceOp.MAX, group=tp_group)
    x = x - shift
    sum_exp = x.exp().sum(dim=-1, keepdim=True)
    if tp_group.size() > 1:
        dist.all_reduce(sum_exp, group=tp_group)
    return x - sum_exp.log()


def _vocab_start(local_vocab: int, tp_group) -> int:
    return dist.get_rank(group=tp_group) * local_vocab if tp_group.size() > 1 else 0


@torch.no_grad()
def vocab_parallel_topk_log_probs(
    logits: torch.Tensor, k: int, *, temperature: float = 1.0, tp_group=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest log-probs of softmax(logits / temperature) per token and their global ids.

    Args:
        logits: `[..., vocab / tp]` this rank's vocabulary slice.
        k: how many per token (at most the full vocabulary).
    Returns:
        (log_probs `[..., k]` fp32, descending; ids `[..., k]` int64), the same on every TP rank.
    """
    tp_group = _group(tp_group)
    logp = _log_softmax(logits, temperature, tp_group)
    local = min(k, logp.shape[-1])
    values, ids = logp.topk(local, dim=-1)
    ids = ids + _vocab_start(logp.shape[-1], tp_group)
    tp = tp_group.size()
    if tp > 1:
        all_values, all_ids = [torch.empty_like(values) for _ in range(tp)], [torch.empty_like(ids) for _ in range(tp)]
        dist.all_gather(all_values, values.contiguous(), group=tp_group)
        dist.all_gather(all_ids, ids.contiguous(), group=tp_group)
        values, ids = torch.cat(all_values, dim=-1), torch.cat(all_ids, dim=-1)
    values, order = values.topk(k, dim=-1)
    return values, ids.gather(-1, order)


def vocab_parallel_forward_kl_topk(
    logits: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    teacher_ids: torch.Tensor,
    *,
    temperature: float = 1.0,
    log_prob_min_clamp: float | None = None,
    tp_group=None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """KL(teacher || student) over the teacher's top-k tokens, per token (verl's forward_kl_topk):

        sum_i p_i (log p_i - log q_i),  i in the teacher's top-k,

    p the teacher's probabilities (its log-probs clamped below at `log_prob_min_clamp`), q =
    softmax(logits / temperature) the student's, log q_i clamped the same way (a clamped term has no
    gradient).

    Args:
        logits: `[..., vocab / tp]` the student's slice (differentiable).
        teacher_log_probs: `[..., k]`; teacher_ids: `[..., k]` global vocabulary ids.
    Returns:
        (loss `[...]` differentiable w.r.t. `logits`, student_mass `[...]` = sum_i q_i, teacher_mass
        `[...]` = sum_i p_i), the same on every TP rank.
    """
    return _ForwardKLTopK.apply(logits, teacher_log_probs, teacher_ids, float(temperature), log_prob_min_clamp,
                                _group(tp_group))


class _ForwardKLTopK(torch.autograd.Function):
    """d loss / d x_j = (1/T) (m q_j - p_j [j active]), x the local logits, m = sum of p_i over the
    active (unclamped) top-k entries: the gradient of -sum_i p_i log q_i."""

    @staticmethod
    def forward(ctx, logits, teacher_log_probs, teacher_ids, temperature, min_clamp, tp_group):
        logq = _log_softmax(logits, temperature, tp_group)
        local_vocab = logq.shape[-1]
        local_ids = teacher_ids - _vocab_start(local_vocab, tp_group)
        mine = (local_ids >= 0) & (local_ids < local_vocab)
        index = local_ids.clamp(0, local_vocab - 1)
        logp = teacher_log_probs.float()
        if min_clamp is not None:
            logp = logp.clamp_min(min_clamp)
        p = logp.exp()
        student = logq.gather(-1, index)
        active = mine
        if min_clamp is not None:
            active = active & (student > min_clamp)
            student = student.clamp_min(min_clamp)
        p_mine = p * mine
        parts = torch.stack([(p_mine * (logp - student)).sum(-1), (student.exp() * mine).sum(-1),
                             (p * active).sum(-1)])
        if tp_group.size() > 1:
            dist.all_reduce(parts, group=tp_group)
        loss, student_mass, active_mass = parts
        ctx.save_for_backward(logq, index, p * active, active_mass)
        ctx.temperature, ctx.dtype = temperature, logits.dtype
        ctx.mark_non_differentiable(student_mass)
        return loss, student_mass, p.sum(-1)

    @staticmethod
    def backward(ctx, grad_loss, _grad_student_mass, _grad_teacher_mass):
        logq, index, p_active, active_mass = ctx.saved_tensors
        if grad_loss is None:
            return None, None, None, None, None, None
        grad = logq.exp_().mul_(active_mass.unsqueeze(-1))
        grad.scatter_add_(-1, index, -p_active)
        grad.mul_((grad_loss / ctx.temperature).unsqueeze(-1))
        return grad.to(ctx.dtype), None, None, None, None, None
