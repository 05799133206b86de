"""The PPO update loop shared by the actor and critic: ppo_epochs x mini-batches (one
optimizer step each) x micro-batches (gradient accumulation), with its metric bookkeeping."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from megarl.algorithms import GlobalDenominator
from megarl.protocol import DataProto
from megarl.utils.nonfinite import check_update
from megarl.workers.megatron.inputs import response_mask_of
from megarl.workers.megatron.schedule import MicroBatch, broadcast_from_last_stage

if TYPE_CHECKING:
    from megarl.workers.megatron.engine import MegatronEngine, MicroBatchSpec

__all__ = ["mini_batch_rows", "iterate_mini_batches", "global_denominator", "reduce_micro_stats", "mean_metrics",
           "NonFiniteCheck", "update_inputs", "run_ppo_update", "LossFn"]

# (model output of one micro-batch, the micro-batch) -> (its share of the mini-batch loss, stats)
LossFn = Callable[[torch.Tensor, MicroBatch], tuple[torch.Tensor, dict]]


def update_inputs(
    data: DataProto, required: Sequence[str], optional: Sequence[str] = (), *, method: str,
    hints: Mapping[str, str] | None = None,
) -> dict[str, torch.Tensor]:
    """The loss inputs of an update: `response_mask` `[B, R]` (else the response part of
    attention_mask), every `required` key (KeyError naming `method`, the key and its hint when
    missing) and the `optional` keys present."""
    batch = data.batch
    tensors = {"response_mask": response_mask_of(data)}
    for key in required:
        if key not in batch.keys():
            hint = (hints or {}).get(key, "")
            raise KeyError(f"{method}: the batch lacks {key!r}{f' ({hint})' if hint else ''}")
        tensors[key] = batch[key]
    tensors.update({key: batch[key] for key in optional if key in batch.keys()})
    return tensors


def run_ppo_update(
    engine: MegatronEngine,
    data: DataProto,
    loss_tensors: dict[str, torch.Tensor],
    make_loss_fn: Callable[[GlobalDenominator], LossFn],
    spec: MicroBatchSpec,
    *,
    mini_batch_size: int,
    rollout_n: int,
    ppo_epochs: int,
    shuffle: bool,
    seed: int,
    prefix: str,
    phase: str,
    metric_prefix: str,
    share_keys: Sequence[str],
    fp32_output: bool = True,
    routing: str | None = None,
) -> dict[str, float]:
    """One PPO update of `engine`: ppo_epochs x mini-batches x micro-batches.

    Args:
        data: this DP rank's rows; input_ids/attention_mask/position_ids `[B, P+R]` are read,
            meta_info gives nan_policy / global_step (NonFiniteCheck).
        loss_tensors: per-row loss inputs `{key: [B, ...]}`, `response_mask` `[B, R]` among them
            (see `update_inputs`); they reach the loss as `mb.tensors`.
        make_loss_fn: mini-batch denominator (valid tokens / sequences of the whole mini-batch
            over all micro-batches and DP ranks) -> per-micro-batch loss function.
        mini_batch_size: prompts per optimizer step (`ppo_mini_batch_size`), x `rollout_n` responses.
        shuffle, seed: reshuffle rows per epoch (`shuffle`, `data_loader_seed`).
        prefix: dotted config path of the role (messages); phase: trainer phase (NaN errors);
        metric_prefix: "actor" | "critic" (`<metric_prefix>/grad_norm`, `/lr`, ...).
        share_keys: stats that are shares of the global-denominator loss (summed, not averaged).
        fp32_output: upcast the model output to fp32 before the loss.
        routing: MoE routing replay of every forward (REPLAY: the batch's `routed_experts` `[B, S, MoE layers,
            top-k]`; see MegatronEngine.forward), inside a pass the caller opened; None: routers choose.

    Returns metrics averaged over the mini-batch steps kept (a non-finite step is dropped under
    nan_policy=skip), the same on every rank. Advances the lr schedule once.
    """
    model_keys = ("input_ids", "attention_mask", "position_ids") + (("routed_experts",) if routing is not None else ())
    model_tensors = {k: data.batch[k] for k in model_keys}
    work = DataProto.from_dict({**model_tensors, **loss_tensors})
    rows = mini_batch_rows(mini_batch_size, rollout_n, len(work), prefix)
    nan_check = NonFiniteCheck(data.meta_info, prefix, phase, int(ppo_epochs) * (len(work) // rows))
    steps = []
    for index in iterate_mini_batches(len(work), rows, ppo_epochs, shuffle, seed):
        mini = work[index]
        denominator = global_denominator(mini.batch["response_mask"])
        micro, _ = engine.micro_batches(mini, spec, tuple(loss_tensors), routes=routing is not None)
        micro_stats, grad_norm, lr = engine.train_step(micro, make_loss_fn(denominator), fp32_output=fp32_output,
                                                       routing=routing)
        step = reduce_micro_stats(micro_stats, share_keys)
        step.update({f"{metric_prefix}/grad_norm": grad_norm, f"{metric_prefix}/lr": lr})
        if not nan_check.drop(step, engine.optimizer):
            steps.append(step)
    engine.step_scheduler()
    return broadcast_from_last_stage({**mean_metrics(steps), **nan_check.metrics(metric_prefix)})


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
        if "nan_policy" not in meta_info:  # one source: trainer.nan_policy (the trainer sets it every update)
            raise KeyError(f"{role}: {phase} got no meta_info['nan_policy']; the trainer sets it from trainer.nan_policy")
        self.policy = str(meta_info["nan_policy"])
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
