"""Log-probs and entropy from tensor-parallel (vocab-sharded) logits.

Each tensor-parallel rank holds logits for a contiguous slice of the vocabulary
(`[..., vocab / tp]`, megatron's `ColumnParallelLinear` output layer with
`parallel_output=True`). The full vocabulary is never gathered: three small all-reduces
over the TP group give the max, the partition function and the target logit.

Gradients: the max is a detached shift (log-softmax is shift invariant); sums go through
megatron's `reduce_from_tensor_model_parallel_region` (all-reduce forward, identity
backward), which is exact because every TP rank computes the same loss from the reduced
values. Logits of vocab padding rows may be `-inf` (megarl masks them): they contribute
zero probability and no NaN.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

__all__ = ["vocab_parallel_log_probs", "vocab_parallel_log_probs_and_entropy"]


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
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    tp_group = tp_group if tp_group is not None else parallel_state.get_tensor_model_parallel_group()
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    local_vocab = logits.shape[-1]
    vocab_start = _local_vocab_start(local_vocab, tp_group)

    with torch.no_grad():
        shift = logits.max(dim=-1, keepdim=True).values
        if tp_group.size() > 1:
            dist.all_reduce(shift, op=dist.ReduceOp.MAX, group=tp_group)
    shifted = logits - shift  # [..., V/tp], <= 0
    exp_shifted = shifted.exp()
    sum_exp = reduce_from_tensor_model_parallel_region(exp_shifted.sum(dim=-1), group=tp_group)
    log_z = sum_exp.log()  # [...]

    local_target = target - vocab_start
    in_slice = (local_target >= 0) & (local_target < local_vocab)
    index = local_target.clamp(0, local_vocab - 1).unsqueeze(-1)
    target_local = shifted.gather(-1, index).squeeze(-1).masked_fill(~in_slice, 0.0)
    target_shifted = reduce_from_tensor_model_parallel_region(target_local, group=tp_group)
    log_probs = target_shifted - log_z

    if not compute_entropy:
        return log_probs, None
    # H = log Z - E_p[z]; -inf rows (vocab padding) have p = 0 and are zeroed first.
    finite_shifted = shifted.masked_fill(~torch.isfinite(shifted), 0.0)
    weighted = reduce_from_tensor_model_parallel_region(
        (exp_shifted * finite_shifted).sum(dim=-1), group=tp_group
    )
    entropy = log_z - weighted / sum_exp
    return log_probs, entropy


def vocab_parallel_log_probs(
    logits: torch.Tensor, target: torch.Tensor, *, temperature: float = 1.0, tp_group=None
) -> torch.Tensor:
    """`vocab_parallel_log_probs_and_entropy` without the entropy: `[...]`."""
    return vocab_parallel_log_probs_and_entropy(
        logits, target, temperature=temperature, compute_entropy=False, tp_group=tp_group
    )[0]
