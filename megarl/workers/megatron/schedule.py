"""Run micro-batches through megatron's pipeline schedules (PP, VPP, gradient accumulation).

`run_schedule` hides `get_forward_backward_func`: every micro-batch is built into model
inputs, passed through the model chunks, and on the last pipeline stage handed to a
`loss_fn(output, micro_batch) -> (loss, stats)`. Megatron divides each loss by the number of
micro-batches before backward; `run_schedule` multiplies it back so that `loss` is summed,
which is what micro-batch-split invariant losses (shares of a global denominator) need.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.utils import get_model_config

from megarl.compat.megatron_core.schedule import needs_uniform_shapes, unbatched_p2p_at_pp2
from megarl.workers.megatron.inputs import MicroBatchInputs, pad_inputs

__all__ = ["ForwardHooks", "MicroBatch", "run_schedule", "broadcast_from_last_stage", "uniform_shapes"]

LossFn = Callable[[torch.Tensor, "MicroBatch"], tuple[torch.Tensor, dict[str, Any]]]


class ForwardHooks(Protocol):
    """Called around each model chunk's forward on a micro-batch (e.g. MoE routing replay): ``inputs`` are
    what the chunk sees (padded to the pass's shape under VPP training), ``rows`` the micro-batch's rows."""

    def before_forward(self, chunk: torch.nn.Module, inputs: MicroBatchInputs, rows: list[int]) -> None: ...

    def after_forward(self, chunk: torch.nn.Module, inputs: MicroBatchInputs, rows: list[int]) -> None: ...


class MicroBatch:
    """Model inputs plus the rows' tensors the loss needs (`[b, ...]` each)."""

    def __init__(self, inputs: MicroBatchInputs, tensors: dict[str, torch.Tensor], rows: list[int]):
        self.inputs = inputs
        self.tensors = tensors
        self.rows = rows


def run_schedule(
    chunks: Sequence[torch.nn.Module],
    micro_batches: Sequence[MicroBatch],
    loss_fn: LossFn,
    *,
    forward_only: bool,
    loss_scale: float = 1.0,
    fp32_output: bool = True,
    hooks: Sequence[ForwardHooks] = (),
) -> list[dict[str, Any]]:
    """One pass over `micro_batches` (forward, and backward unless `forward_only`).

    Args:
        chunks: the model chunks of this rank (one per virtual pipeline stage).
        loss_fn: called on the last pipeline stage with the last chunk's output
            (`[b, s, V/tp]` logits or `[b, s, 1]` values; s = this CP rank's tokens) and its micro-batch; returns the
            loss to back-propagate and a dict of stats (tensors/floats) to collect.
        loss_scale: multiplies every loss before megatron's own 1/num_micro_batches
            (the caller passes num_micro_batches * dp_size to get summed gradients
            out of megatron's averaging).
        fp32_output: False hands `loss_fn` the bf16/fp16 output of a Float16Module-wrapped
            model as is (no fp32 copy of `[b, s, V/tp]` logits; the actor's vocab-parallel
            log-prob upcasts once itself).
        hooks: called around every chunk forward (see ForwardHooks).

    Returns:
        The stats dicts in micro-batch order on the last pipeline stage; [] elsewhere.
    """
    if not micro_batches:
        return []
    config = get_model_config(chunks[0])
    model_inputs = [mb.inputs for mb in micro_batches]
    if needs_uniform_shapes(len(chunks), forward_only):  # megarl.compat.megatron_core.schedule
        model_inputs = uniform_shapes(model_inputs)
    # Shapes differ between micro-batches with packing, dynamic batch size or a last
    # partial micro-batch; pipeline stages then exchange shapes before each activation.
    shapes = {tuple(inputs.input_ids.shape) for inputs in model_inputs}
    config.variable_seq_lengths = len(shapes) > 1
    num_micro_batches = len(micro_batches)
    if len(chunks) > 1:
        # Interleaved schedule: micro-batches run in groups of N per virtual stage, and
        # megatron needs M % N == 0 (N in [pp, M]); N = M covers counts not divisible by pp.
        pp_size = parallel_state.get_pipeline_model_parallel_world_size()
        config.microbatch_group_size_per_vp_stage = pp_size if num_micro_batches % pp_size == 0 else num_micro_batches
        unbatched_p2p_at_pp2(config, pp_size)
    output_kwargs = {} if fp32_output or not _half_wrapped(chunks[0]) else {"fp32_output": False}

    def forward_step(data_iterator, model):
        inputs, micro_batch = next(data_iterator)
        for hook in hooks:
            hook.before_forward(model, inputs, micro_batch.rows)
        output = model(
            # No attention mask: rows are front-aligned or packed (see inputs.py), so causal
            # attention alone keeps every token away from padding.
            inputs.local(inputs.input_ids), inputs.local(inputs.position_ids), None, **inputs.model_kwargs(), **output_kwargs
        )
        for hook in hooks:
            hook.after_forward(model, inputs, micro_batch.rows)

        padded = inputs is not micro_batch.inputs  # uniform_shapes padded it

        def loss_func(output_tensor):
            if padded:
                # The micro-batch's own rows / tokens lead a padded layout (pad_inputs): the loss
                # never sees the padding, whose outputs get no gradient.
                b, s = micro_batch.inputs.local(micro_batch.inputs.input_ids).shape
                output_tensor = output_tensor[:b, :s]
            loss, stats = loss_fn(output_tensor, micro_batch)
            return loss * (loss_scale * num_micro_batches), stats

        return output, loss_func

    pairs = list(zip(model_inputs, micro_batches))
    data_iterator = [iter(pairs) for _ in chunks] if len(chunks) > 1 else iter(pairs)
    first = model_inputs[0]
    return get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=data_iterator,
        model=list(chunks),
        num_microbatches=num_micro_batches,
        seq_length=first.seq_length,
        micro_batch_size=first.input_ids.shape[0],
        forward_only=forward_only,
    )


def uniform_shapes(inputs: Sequence[MicroBatchInputs]) -> list[MicroBatchInputs]:
    """Every micro-batch's inputs padded to the largest shape among them (see pad_inputs):
    `[b_max, L]` padded rows (L already common: the engine fixes it under VPP) or `[1, T_max]` packed."""
    rows = max(x.input_ids.shape[0] for x in inputs)
    tokens = max(x.input_ids.shape[1] for x in inputs)
    # a micro-batch already of that shape is passed as is (no copies: the common fixed-size case)
    return [x if tuple(x.input_ids.shape) == (rows, tokens) else pad_inputs(x, rows, tokens) for x in inputs]


def _half_wrapped(chunk: torch.nn.Module) -> bool:
    """Whether a Float16Module sits in `chunk`'s wrapper chain (DDP -> Float16Module -> model)."""
    from megatron.core.transformer.module import Float16Module

    while chunk is not None:
        if isinstance(chunk, Float16Module):
            return True
        chunk = getattr(chunk, "module", None)
    return False


def broadcast_from_last_stage(obj: Any) -> Any:
    """Every pipeline stage gets the last stage's python object (tensors inside are CPU-moved)."""
    pp_size = parallel_state.get_pipeline_model_parallel_world_size()
    if pp_size == 1:
        return obj
    group = parallel_state.get_pipeline_model_parallel_group()
    src = parallel_state.get_pipeline_model_parallel_last_rank()
    payload = [obj if parallel_state.is_pipeline_last_stage() else None]
    if isinstance(obj, torch.Tensor) or obj is not None:
        payload[0] = _to_cpu(payload[0])
    torch.distributed.broadcast_object_list(payload, src=src, group=group)
    return payload[0]


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj
