"""Mini-batch iteration and metric bookkeeping shared by the actor and critic updates."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from megarl.algorithms import GlobalDenominator
from megarl.utils.nonfinite import DEFAULT_NAN_POLICY, check_update

__all__ = ["mini_batch_rows", "iterate_mini_batches", "global_denominator", "reduce_micro_stats", "mean_metrics",
           "NonFiniteCheck"]


def mini_batch_rows(ppo_mini_batch_size: int, rollout_n: int, num_rows: int, prefix: str) -> int:
    """Rows per mini-batch on this DP rank: ppo_mini_batch_size * rollout.n / dp_size."""
    dp_size = parallel_state.get_data_parallel_world_size()
    total = int(ppo_mini_batch_size) * int(rollout_n)
    if total <= 0 or total % dp_size != 0:
        raise ValueError(
            f"{prefix}.ppo_mini_batch_size ({ppo_mini_batch_size}) * rollout.n ({rollout_n}) = {total} "
            f"must be a positive multiple of the data-parallel size ({dp_size})"
        )
    rows = total // dp_size
    if num_rows % rows != 0:
        raise ValueError(
            f"{prefix}: this rank holds {num_rows} responses, not a multiple of the per-rank mini-batch "
            f"{rows} (= {prefix}.ppo_mini_batch_size * rollout.n / dp_size)"
        )
    return rows


def iterate_mini_batches(num_rows: int, rows_per_mini_batch: int, epochs: int, shuffle: bool, seed: int) -> Iterator[torch.Tensor]:
    """Row indices of each mini-batch, `epochs` passes; shuffled per epoch with a fixed seed."""
    for epoch in range(int(epochs)):
        if shuffle:
            order = torch.randperm(num_rows, generator=torch.Generator().manual_seed(int(seed) + epoch))
        else:
            order = torch.arange(num_rows)
        yield from order.split(rows_per_mini_batch)


def global_denominator(response_mask: torch.Tensor) -> GlobalDenominator:
    """Valid tokens and sequences of a mini-batch summed over all DP ranks."""
    local = GlobalDenominator.from_mask(response_mask)
    counts = torch.tensor([local.num_tokens, local.num_seqs], dtype=torch.float64)
    group = parallel_state.get_data_parallel_group()
    if parallel_state.get_data_parallel_world_size() > 1:
        if dist.get_backend(group) == "nccl":
            counts = counts.cuda()
        dist.all_reduce(counts, group=group)
    return GlobalDenominator(num_tokens=float(counts[0]), num_seqs=float(counts[1]))


def reduce_micro_stats(stats: Sequence[dict], sum_keys: Sequence[str]) -> dict[str, float]:
    """One mini-batch's metrics from its micro-batches' stats and all DP ranks.

    Keys in `sum_keys` are shares of a global-denominator loss: summed (micro-batches, then
    DP ranks) they give the mini-batch value. Other keys are averaged.
    """
    from megarl.workers.megatron.engine import dp_all_reduce

    if not stats:
        return {}
    keys = sorted(stats[0])
    local = {}
    for key in keys:
        values = [float(s[key]) for s in stats]
        local[key] = sum(values) if key in sum_keys else sum(values) / len(values)
    return dp_all_reduce(local, sum_keys=sum_keys)


def mean_metrics(per_step: Sequence[dict[str, float]]) -> dict[str, float]:
    """Average each metric over mini-batch steps."""
    acc: dict[str, list[float]] = defaultdict(list)
    for step in per_step:
        for key, value in step.items():
            acc[key].append(float(value))
    return {key: sum(v) / len(v) for key, v in acc.items()}


class NonFiniteCheck:
    """Per-update NaN/Inf bookkeeping (megarl.utils.nonfinite): ``drop(step_metrics)`` after each
    mini-batch step raises under ``nan_policy=stop`` or returns True (dropped) under ``skip``.

    Args:
        meta_info: the update batch's meta_info (``nan_policy``, ``global_step`` from the trainer).
        role: config prefix for messages; phase: trainer phase; num_mini_batches: steps this update.
    """

    def __init__(self, meta_info: dict, role: str, phase: str, num_mini_batches: int) -> None:
        self.policy = str(meta_info.get("nan_policy", DEFAULT_NAN_POLICY))
        self.global_step = meta_info.get("global_step")
        self.role, self.phase, self.num = role, phase, num_mini_batches
        self.seen = 0
        self.skipped = 0

    def drop(self, step_metrics: dict[str, float], optimizer=None) -> bool:
        """``optimizer``: the engine's (guarded) optimizer; an fp16 loss-scale overflow there is
        megatron's normal skip, so only the losses are checked against the policy then."""
        last = getattr(optimizer, "megarl_last_step", None) or {}
        checked = dict(step_metrics)
        if last.get("scaler_overflow"):
            checked = {k: v for k, v in checked.items() if not k.endswith("/grad_norm")}
        dropped = check_update(checked, role=self.role, phase=self.phase, global_step=self.global_step,
                               policy=self.policy, mini_batch=self.seen, num_mini_batches=self.num)
        dropped = dropped or bool(last.get("scaler_overflow"))
        self.seen += 1
        self.skipped += int(dropped)
        return dropped

    def metrics(self, prefix: str) -> dict[str, float]:
        """``<prefix>/nonfinite_skipped_steps`` under ``skip`` or when fp16 overflows skipped steps."""
        if self.policy == "skip" or self.skipped:
            return {f"{prefix}/nonfinite_skipped_steps": float(self.skipped)}
        return {}
