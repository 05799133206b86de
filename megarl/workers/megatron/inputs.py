"""Model inputs for one micro-batch, and per-position outputs back to `[b, response_len]`.

Two layouts (`actor_rollout_ref.model.use_remove_padding`):

* padded: each row's valid tokens moved to the front (`[b, L]`, L = the longest row, or a
  length the caller fixes), padding only after them, and no attention mask. Causal
  attention then never lets a token see padding, so no mask is needed: every attention
  implementation (SDPA, transformer-engine) runs its mask-free causal kernel. Rows with
  left padding (verl's prompts) would otherwise need a padding mask, which
  transformer-engine ignores with megatron's `causal` mask type (it attended to the
  padding) and which sends SDPA to its slow masked kernels.
* packed (thd): the valid tokens of all rows concatenated into `[1, T]`, positions restarting
  at 0 per row, `PackedSeqParams` with cumulative lengths; no compute on padding. T is
  padded to a multiple of `pad_multiple` (TP size, for sequence parallelism) with a
  dummy trailing segment.

Per-position model outputs are "the prediction made at position j": the log-prob of the
next valid token, or the value of the state ending at j. :func:`to_response` scatters them
back to the rows' original `[b, S]` layout and takes the response slice, positions
`S - R - 1 .. S - 2` (verl's `[:, -R - 1 : -1]`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from megatron.core import parallel_state
from megatron.core.packed_seq_params import PackedSeqParams

__all__ = ["MicroBatchInputs", "build_inputs", "next_token_labels", "to_response", "response_mask_of", "valid_length"]


def response_mask_of(data: Any) -> torch.Tensor:
    """`response_mask` `[B, R]` of a DataProto, or the response part of attention_mask when absent."""
    if "response_mask" in data.batch.keys():
        return data.batch["response_mask"]
    response_length = data.batch["responses"].shape[1]
    return data.batch["attention_mask"][:, -response_length:]


@dataclass
class MicroBatchInputs:
    """What the model chunks receive, plus what is needed to undo the layout."""

    input_ids: torch.Tensor  # [b, L] front-aligned or [1, T] packed
    position_ids: torch.Tensor  # same shape as input_ids
    packed_seq_params: PackedSeqParams | None
    valid_mask: torch.Tensor  # [b, S] bool, HF attention_mask of the rows (original layout)
    token_mask: torch.Tensor  # same shape as input_ids, bool: positions holding a valid token

    def model_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if self.packed_seq_params is not None:
            kwargs["packed_seq_params"] = self.packed_seq_params
        return kwargs

    @property
    def seq_length(self) -> int:
        return self.input_ids.shape[1]


def valid_length(attention_mask: torch.Tensor, multiple: int = 1) -> int:
    """Longest row of `attention_mask` `[b, S]` in tokens, rounded up to `multiple` (>= 1)."""
    longest = max(int(attention_mask.sum(-1).max()), 1) if attention_mask.numel() else 1
    return -(-longest // multiple) * multiple


def build_inputs(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    *,
    remove_padding: bool,
    pad_multiple: int = 1,
    length: int | None = None,
) -> MicroBatchInputs:
    """Inputs for `[b, S]` rows (HF attention_mask: 1 = token) in either layout.

    Args:
        length: padded layout only: the sequence length L of the front-aligned rows
            (>= the longest row); default the longest row rounded up to `pad_multiple`.
            Callers fix it to give every micro-batch one shape (pipeline schedules).
    """
    valid = attention_mask.bool()
    seq_lens = valid.sum(-1)  # [b]
    device = input_ids.device
    if not remove_padding:
        length = valid_length(valid, pad_multiple) if length is None else int(length)
        longest = int(seq_lens.max()) if seq_lens.numel() else 0
        if length < longest:
            raise ValueError(f"build_inputs: length {length} is shorter than the longest row ({longest} tokens)")
        token_mask = torch.arange(length, device=device) < seq_lens[:, None]  # [b, L]
        front_ids = input_ids.new_zeros((input_ids.shape[0], length))
        front_ids[token_mask] = input_ids[valid]
        # Positions after a row's tokens continue counting (megatron's rope uses 0..L-1
        # anyway; these positions only feed padding, which no valid token attends to).
        front_pos = torch.arange(length, device=device, dtype=position_ids.dtype).expand(input_ids.shape[0], -1).clone()
        front_pos[token_mask] = position_ids[valid]
        return MicroBatchInputs(
            input_ids=front_ids, position_ids=front_pos, packed_seq_params=None,
            valid_mask=valid, token_mask=token_mask,
        )
    seq_lens = seq_lens.to(torch.int32)
    tokens = input_ids[valid]
    positions = torch.cat([torch.arange(int(n), device=device) for n in seq_lens])
    total = tokens.numel()
    padded_total = -(-total // pad_multiple) * pad_multiple
    cu_seqlens = torch.zeros(len(seq_lens) + 1, dtype=torch.int32, device=device)
    cu_seqlens[1:] = seq_lens.cumsum(0)
    if padded_total > total:  # dummy trailing segment, never read back
        extra = padded_total - total
        tokens = torch.cat([tokens, tokens.new_zeros(extra)])
        positions = torch.cat([positions, torch.arange(extra, device=device)])
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
        packed_seq_params=params,
        valid_mask=valid,
        token_mask=(torch.arange(padded_total, device=device) < total).unsqueeze(0),
    )


def next_token_labels(inputs: MicroBatchInputs) -> torch.Tensor:
    """Token at position j + 1 for every position j (same shape as input_ids).

    The last token of each row is followed by padding, the next packed row or a wrap-around;
    its prediction is never part of the response slice (or is masked by response_mask).
    """
    return torch.roll(inputs.input_ids, shifts=-1, dims=1)


def to_response(per_position: torch.Tensor, inputs: MicroBatchInputs, response_length: int) -> torch.Tensor:
    """`[b, L]` / `[1, T]` per-position values -> `[b, response_length]` (0 where padded)."""
    valid = inputs.valid_mask
    full = per_position.new_zeros(valid.shape)
    full[valid] = per_position[inputs.token_mask]
    seq_len = full.shape[1]
    return full[:, seq_len - response_length - 1 : seq_len - 1]
