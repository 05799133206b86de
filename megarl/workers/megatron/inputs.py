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

Context parallelism (`megatron.context_parallel_size` c > 1): the model sees only this CP
rank's two load-balanced chunks of every row (`MicroBatchInputs.local`; packed rows each
padded to a multiple of 2c first); per-position outputs are all-gathered back to the whole
layout in :func:`to_response`, so losses are computed on whole sequences, the same on every
CP rank.

Per-position model outputs are "the prediction made at position j": the log-prob of the
next valid token, or the value of the state ending at j. :func:`to_response` scatters them
back to the rows' original `[b, S]` layout and takes the response slice, positions
`S - R - 1 .. S - 2` (verl's `[:, -R - 1 : -1]`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from megatron.core import parallel_state
from megatron.core.packed_seq_params import PackedSeqParams

from megarl.parallel.context_parallel import cp_token_index, gather_tokens_from_cp

__all__ = [
    "MicroBatchInputs", "at_last_token", "build_inputs", "next_token_labels", "pad_inputs", "to_response", "response_mask_of",
    "valid_length",
]


def response_mask_of(data: Any) -> torch.Tensor:
    """`response_mask` `[B, R]` of a DataProto, or the response part of attention_mask when absent."""
    if "response_mask" in data.batch.keys():
        return data.batch["response_mask"]
    response_length = data.batch["responses"].shape[1]
    return data.batch["attention_mask"][:, -response_length:]


@dataclass
class MicroBatchInputs:
    """What the model chunks receive, plus what is needed to undo the layout.

    ``input_ids`` / ``position_ids`` / ``token_mask`` span the whole layout; under context
    parallelism the model gets this CP rank's tokens of it (:meth:`local`) and per-token
    outputs come back whole through :func:`to_response`.
    """

    input_ids: torch.Tensor  # [b, L] front-aligned or [1, T] packed
    position_ids: torch.Tensor  # same shape as input_ids
    packed_seq_params: PackedSeqParams | None
    valid_mask: torch.Tensor  # [b, S] bool, HF attention_mask of the rows (original layout)
    token_mask: torch.Tensor  # same shape as input_ids, bool: positions holding a valid token
    cp_group: Any = None  # context-parallel group; None without context parallelism
    cp_index: torch.Tensor | None = None  # [cp, L / cp]: each CP rank's positions on dim 1 (cp_token_index)
    routes: torch.Tensor | None = None  # [b, L, MoE layers, top-k] / [1, T, ...] int16 experts to replay, -1: none

    def model_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if self.packed_seq_params is not None:
            kwargs["packed_seq_params"] = self.packed_seq_params
        return kwargs

    def local(self, per_position: torch.Tensor) -> torch.Tensor:
        """This CP rank's tokens of a `[b, L, ...]` / `[1, T, ...]` tensor (all of it without CP)."""
        if self.cp_index is None:
            return per_position
        return per_position[:, self.cp_index[self.cp_group.rank()].to(per_position.device)]

    def router_positions(self, sequence_parallel: bool) -> torch.Tensor:
        """Positions in the flattened layout (`row * L + column`) of the tokens this rank's MoE routers see,
        in their order: `[s_local * b]`, sequence-major (megatron routes `[s, b, h]` hidden states flattened),
        this CP rank's tokens (`local`), and under sequence parallelism this TP rank's contiguous slice of
        them (megatron scatters the sequence dim in equal parts)."""
        b, length = self.input_ids.shape
        grid = self.local(torch.arange(b * length, device=self.input_ids.device).view(b, length)).t()  # [s, b]
        if sequence_parallel:
            from megatron.core import parallel_state

            grid = grid.chunk(parallel_state.get_tensor_model_parallel_world_size())[
                parallel_state.get_tensor_model_parallel_rank()]
        return grid.reshape(-1)

    @property
    def seq_length(self) -> int:
        """Full length (megatron's schedules divide it by the CP size themselves)."""
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
    cp_group: Any = None,
    routes: torch.Tensor | None = None,
) -> MicroBatchInputs:
    """Inputs for `[b, S]` rows (HF attention_mask: 1 = token) in either layout.

    Args:
        pad_multiple: the padded row length / packed total is a multiple of it.
        length: padded layout only: the sequence length L of the front-aligned rows
            (>= the longest row); default the longest row rounded up to `pad_multiple`.
            Callers fix it to give every micro-batch one shape (pipeline schedules).
        cp_group: context-parallel group of size c > 1, or None: the layout is split into
            megatron's load-balanced chunks (megarl.parallel.context_parallel). Padded: L must be a
            multiple of 2c (`pad_multiple` one); packed: each row is padded to a multiple of 2c
            (`cu_seqlens_q_padded`, as transformer-engine expects) and `pad_multiple` must be one of 2c.
        routes: `[b, S, MoE layers, top-k]` experts per token to replay (megarl.workers.megatron.router_replay),
            laid out as the tokens, -1 on padding.
    """
    cp_size = cp_group.size() if cp_group is not None else 1
    if cp_size > 1 and pad_multiple % (2 * cp_size):
        raise ValueError(f"build_inputs: pad_multiple {pad_multiple} is not a multiple of 2 x context_parallel_size")
    cp_group = cp_group if cp_size > 1 else None
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
            valid_mask=valid, token_mask=token_mask, cp_group=cp_group,
            cp_index=cp_token_index([length], cp_size) if cp_group is not None else None,
            routes=_placed(routes, valid, token_mask),
        )
    seq_lens = seq_lens.to(torch.int32)
    # Under CP each row is padded to 2c tokens (transformer-engine's thd split, megatron's thd rope).
    row_multiple = 2 * cp_size if cp_group is not None else 1
    padded_lens = (seq_lens + row_multiple - 1) // row_multiple * row_multiple
    total = int(padded_lens.sum())
    padded_total = -(-total // pad_multiple) * pad_multiple
    starts = padded_lens.cumsum(0) - padded_lens
    rows, within = valid.nonzero(as_tuple=True)
    within = valid.cumsum(-1)[rows, within] - 1  # index of each valid token in its row
    dest = (starts[rows] + within).long()  # row-major, as input_ids[valid]
    tokens = input_ids.new_zeros(padded_total)
    tokens[dest] = input_ids[valid]
    token_mask = torch.zeros(padded_total, dtype=torch.bool, device=device)
    token_mask[dest] = True
    segments = padded_lens.tolist()
    if padded_total > total:  # dummy trailing segment, never read back
        segments.append(padded_total - total)
    positions = torch.cat([torch.arange(n, device=device) for n in segments]) if segments else tokens.new_zeros(0)
    cu_padded = torch.zeros(len(segments) + 1, dtype=torch.int32, device=device)
    cu_padded[1:] = torch.tensor(segments, dtype=torch.int32, device=device).cumsum(0)
    cu_valid = cu_padded
    if cp_group is not None:  # transformer-engine: real lengths + padded offsets
        lens = torch.tensor(segments, dtype=torch.int32, device=device)
        lens[: len(seq_lens)] = seq_lens
        cu_valid = torch.zeros_like(cu_padded)
        cu_valid[1:] = lens.cumsum(0)
    max_len = max(segments, default=0)
    params = PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu_valid,
        cu_seqlens_kv=cu_valid,
        cu_seqlens_q_padded=cu_padded if cp_group is not None else None,
        cu_seqlens_kv_padded=cu_padded if cp_group is not None else None,
        max_seqlen_q=max_len,
        max_seqlen_kv=max_len,
        cp_group=cp_group if cp_group is not None else parallel_state.get_context_parallel_group(),
    )
    return MicroBatchInputs(
        input_ids=tokens.unsqueeze(0),
        position_ids=positions.unsqueeze(0),
        packed_seq_params=params,
        valid_mask=valid,
        token_mask=token_mask.unsqueeze(0),
        cp_group=cp_group,
        cp_index=cp_token_index(segments, cp_size) if cp_group is not None else None,
        routes=_placed(routes, valid, token_mask.unsqueeze(0)),
    )


def _placed(routes: torch.Tensor | None, valid: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor | None:
    """`routes` `[b, S, ...]` of the valid tokens moved where `token_mask` puts them, -1 elsewhere."""
    if routes is None:
        return None
    out = routes.new_full((*token_mask.shape, *routes.shape[2:]), -1)
    out[token_mask] = routes[valid]
    return out


def _extended(routes: torch.Tensor | None, dim: int, extra: int) -> torch.Tensor | None:
    """`routes` with `extra` rows (dim 0) or tokens (dim 1) of -1 appended."""
    if routes is None or extra == 0:
        return routes
    shape = list(routes.shape)
    shape[dim] = extra
    return torch.cat([routes, routes.new_full(shape, -1)], dim=dim)


def pad_inputs(inputs: MicroBatchInputs, rows: int, tokens: int) -> MicroBatchInputs:
    """The same micro-batch laid out as `[rows, L]` (padded layout, `rows` >= b: extra all-padding
    rows) or `[1, tokens]` (packed, `tokens` >= T: a trailing padding segment of tokens - T).

    Gives pipeline schedules one input shape for differently sized micro-batches. No original
    token sees the padding (rows are independent; a segment attends within itself), so the
    model's output for `inputs` is the leading `[:b, :s]` part of the padded one's, s = this
    rank's tokens: under context parallelism each segment is split on its own and the added
    segment's tokens come last on every rank (cp_token_index). The padded layout's row length
    cannot change here (it moves the CP split): callers fix it in :func:`build_inputs`.
    """
    b, length = inputs.input_ids.shape
    params = inputs.packed_seq_params
    if params is None:
        if tokens != length:
            raise ValueError(f"pad_inputs: the padded layout keeps its row length {length}, got {tokens}")
        extra = rows - b
        positions = torch.arange(length, device=inputs.position_ids.device, dtype=inputs.position_ids.dtype)
        return replace(
            inputs,
            input_ids=torch.cat([inputs.input_ids, inputs.input_ids.new_zeros((extra, length))]),
            position_ids=torch.cat([inputs.position_ids, positions.expand(extra, -1)]),
            token_mask=torch.cat([inputs.token_mask, inputs.token_mask.new_zeros((extra, length))]),
            valid_mask=torch.cat([inputs.valid_mask, inputs.valid_mask.new_zeros((extra, inputs.valid_mask.shape[1]))]),
            routes=_extended(inputs.routes, 0, extra),
        )
    if rows != 1:
        raise ValueError(f"pad_inputs: the packed layout has one row, got {rows}")
    extra = tokens - length
    if extra == 0:
        return inputs
    device = inputs.input_ids.device

    def appended(cu: torch.Tensor) -> torch.Tensor:
        return torch.cat([cu, cu[-1:] + extra])

    cu_padded = params.cu_seqlens_q_padded if params.cu_seqlens_q_padded is not None else params.cu_seqlens_q
    segments = [*(cu_padded[1:] - cu_padded[:-1]).tolist(), extra]
    cp_padded = appended(cu_padded) if params.cu_seqlens_q_padded is not None else None
    padded_params = replace(
        params, cu_seqlens_q=appended(params.cu_seqlens_q), cu_seqlens_kv=appended(params.cu_seqlens_kv),
        cu_seqlens_q_padded=cp_padded, cu_seqlens_kv_padded=cp_padded,
        max_seqlen_q=max(params.max_seqlen_q, extra), max_seqlen_kv=max(params.max_seqlen_kv, extra),
    )
    return replace(
        inputs,
        input_ids=torch.cat([inputs.input_ids, inputs.input_ids.new_zeros((1, extra))], dim=1),
        position_ids=torch.cat([inputs.position_ids, torch.arange(extra, device=device, dtype=inputs.position_ids.dtype)[None]], dim=1),
        packed_seq_params=padded_params,
        token_mask=torch.cat([inputs.token_mask, inputs.token_mask.new_zeros((1, extra))], dim=1),
        cp_index=cp_token_index(segments, inputs.cp_group.size()) if inputs.cp_index is not None else None,
        routes=_extended(inputs.routes, 1, extra),
    )


def next_token_labels(inputs: MicroBatchInputs) -> torch.Tensor:
    """Token at position j + 1 for every position j the model computes on this rank (the
    shape of `inputs.local(inputs.input_ids)`: under context parallelism this CP rank's tokens).

    The last token of each row is followed by padding, the next packed row or a wrap-around;
    its prediction is never part of the response slice (or is masked by response_mask).
    """
    return inputs.local(torch.roll(inputs.input_ids, shifts=-1, dims=1))


def to_response(per_position: torch.Tensor, inputs: MicroBatchInputs, response_length: int) -> torch.Tensor:
    """Per-position values of this rank's tokens (`[b, L, ...]` / `[1, T, ...]`; under context parallelism
    `[b, L / cp]` / `[1, T / cp]`, all-gathered over the CP group first, differentiably: see
    megarl.parallel.context_parallel) -> `[b, response_length]` (0 where padded), identical on
    every CP rank."""
    full = _original_layout(per_position, inputs)
    seq_len = full.shape[1]
    return full[:, seq_len - response_length - 1 : seq_len - 1]


def response_values(per_position: torch.Tensor, inputs: MicroBatchInputs, response_length: int) -> torch.Tensor:
    """:func:`to_response` for wide per-position values (`[b, L, vocab / tp]` logits): reads the response
    positions alone, without the `[b, S, ...]` buffer of the whole rows; differentiable."""
    if inputs.cp_index is not None:
        return to_response(per_position, inputs, response_length)
    valid = inputs.valid_mask
    seq_len = valid.shape[1]
    ordinal = (valid.flatten().cumsum(0) - 1).view_as(valid)  # i-th valid token of the rows, row-major
    window = slice(seq_len - response_length - 1, seq_len - 1)
    wanted = valid[:, window]
    source = inputs.token_mask.flatten().nonzero().squeeze(1)  # where the i-th valid token sits in the layout
    flat = per_position.reshape(-1, *per_position.shape[2:])
    out = per_position.new_zeros((valid.shape[0], response_length) + per_position.shape[2:])
    out[wanted] = flat[source[ordinal[:, window][wanted]]]
    return out


def at_last_token(per_position: torch.Tensor, inputs: MicroBatchInputs) -> torch.Tensor:
    """Per-position values of this rank's tokens (as :func:`to_response`) -> `[b]`: each row's value
    at its last valid token (a sequence classifier's score, e.g. a reward model's)."""
    full = _original_layout(per_position, inputs)
    valid = inputs.valid_mask
    positions = torch.arange(1, valid.shape[1] + 1, device=valid.device)
    last = (valid.long() * positions).argmax(-1)  # [b]
    return full[torch.arange(full.shape[0], device=full.device), last]


def _original_layout(per_position: torch.Tensor, inputs: MicroBatchInputs) -> torch.Tensor:
    """`[b, L]` / `[1, T]` values (this CP rank's tokens under CP) -> `[b, S]` in the rows' original
    positions (`valid_mask`), 0 where padded; identical on every CP rank."""
    if inputs.cp_index is not None:
        per_position = gather_tokens_from_cp(per_position, inputs.cp_index, inputs.cp_group)
    valid = inputs.valid_mask
    full = per_position.new_zeros(valid.shape + per_position.shape[2:])  # trailing dims: top-k, vocab slice
    full[valid] = per_position[inputs.token_mask]
    return full
