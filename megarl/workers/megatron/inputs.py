"""Model inputs for one micro-batch, and per-position outputs back to `[b, response_len]`.

Two layouts (`actor_rollout_ref.model.use_remove_padding`):

* padded: `input_ids [b, S]` with megatron's padding mask `[b, 1, 1, S]` and HF position
  ids (rope is relative, so left padding does not shift results).
* packed (thd): the valid tokens of all rows concatenated into `[1, T]`, positions restarting
  at 0 per row, `PackedSeqParams` with cumulative lengths; no compute on padding. T is
  padded to a multiple of `pad_multiple` (TP size, for sequence parallelism) with a
  dummy trailing segment.

Per-position model outputs (`[b, S]` or `[1, T]`) are "the prediction made at position
j": the log-prob of token j + 1, or the value of the state ending at j. The response slice
is therefore positions `S - R - 1 .. S - 2` (verl's `[:, -R - 1 : -1]`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from megatron.core import parallel_state
from megatron.core.packed_seq_params import PackedSeqParams

from megarl.models import attention_mask_for_megatron

__all__ = ["MicroBatchInputs", "build_inputs", "next_token_labels", "to_response", "response_mask_of"]


def response_mask_of(data: Any) -> torch.Tensor:
    """`response_mask` `[B, R]` of a DataProto, or the response part of attention_mask when absent."""
    if "response_mask" in data.batch.keys():
        return data.batch["response_mask"]
    response_length = data.batch["responses"].shape[1]
    return data.batch["attention_mask"][:, -response_length:]


@dataclass
class MicroBatchInputs:
    """What the model chunks receive, plus what is needed to undo the layout."""

    input_ids: torch.Tensor  # [b, S] padded or [1, T] packed
    position_ids: torch.Tensor  # same shape as input_ids
    attention_mask: torch.Tensor | None  # [b, 1, 1, S] bool, True = masked; None when packed or unpadded
    packed_seq_params: PackedSeqParams | None
    valid_mask: torch.Tensor  # [b, S] bool, HF attention_mask of the rows

    def model_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if self.packed_seq_params is not None:
            kwargs["packed_seq_params"] = self.packed_seq_params
        return kwargs

    @property
    def seq_length(self) -> int:
        return self.input_ids.shape[1]


def build_inputs(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    *,
    remove_padding: bool,
    pad_multiple: int = 1,
) -> MicroBatchInputs:
    """Inputs for `[b, S]` rows (HF attention_mask: 1 = token) in either layout."""
    valid = attention_mask.bool()
    if not remove_padding:
        # No padding in these rows: no mask, so attention runs its mask-free causal
        # kernel (SDPA's masked kernels are several times slower on GPU).
        no_padding = bool(valid.all())
        return MicroBatchInputs(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=None if no_padding else attention_mask_for_megatron(attention_mask),
            packed_seq_params=None,
            valid_mask=valid,
        )
    seq_lens = valid.sum(-1).to(torch.int32)  # [b]
    tokens = input_ids[valid]
    positions = torch.cat([torch.arange(int(n), device=input_ids.device) for n in seq_lens])
    total = tokens.numel()
    padded_total = -(-total // pad_multiple) * pad_multiple
    cu_seqlens = torch.zeros(len(seq_lens) + 1, dtype=torch.int32, device=input_ids.device)
    cu_seqlens[1:] = seq_lens.cumsum(0)
    if padded_total > total:  # dummy trailing segment, never read back
        extra = padded_total - total
        tokens = torch.cat([tokens, tokens.new_zeros(extra)])
        positions = torch.cat([positions, torch.arange(extra, device=input_ids.device)])
        cu_seqlens = torch.cat([cu_seqlens, cu_seqlens.new_tensor([padded_total])])
    max_len = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    params = PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu_seqlens,
        cu_seqlens_kv=cu_seqlens,
        max_seqlen_q=max_len,
        max_seqlen_kv=max_len,
        cp_group=parallel_state.get_context_parallel_group(),
    )
    return MicroBatchInputs(
        input_ids=tokens.unsqueeze(0),
        position_ids=positions.unsqueeze(0),
        attention_mask=None,
        packed_seq_params=params,
        valid_mask=valid,
    )


def next_token_labels(inputs: MicroBatchInputs) -> torch.Tensor:
    """Token at position j + 1 for every position j (same shape as input_ids).

    The last position of each row wraps to an unrelated token; it is never part of the
    response slice.
    """
    return torch.roll(inputs.input_ids, shifts=-1, dims=1)


def to_response(per_position: torch.Tensor, inputs: MicroBatchInputs, response_length: int) -> torch.Tensor:
    """`[b, S]` / `[1, T]` per-position values -> `[b, response_length]` (0 where padded)."""
    if inputs.packed_seq_params is None:
        full = per_position
    else:
        valid = inputs.valid_mask
        full = per_position.new_zeros(valid.shape)
        full[valid] = per_position[0, : int(valid.sum())]
    seq_len = full.shape[1]
    return full[:, seq_len - response_length - 1 : seq_len - 1]
