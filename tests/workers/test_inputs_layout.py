"""The layouts of megarl.workers.megatron.inputs: rows front-aligned (no attention mask), and the
context-parallel split of padded and packed rows.

Reference: the rows' own tokens (the HF batch), not the module's output.
"""

from __future__ import annotations

import pytest
import torch

from megarl.workers.megatron.inputs import (
    build_inputs, next_token_labels, pad_inputs, response_values, to_response, valid_length,
)

P, R = 5, 4


def _batch():
    """Left-padded prompts + right-padded responses; pad id 9 (ids 10..), one row without padding."""
    prompt_lens, response_lens = [5, 2, 1, 3], [4, 1, 3, 2]
    rows, masks = [], []
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        mask = [0] * (P - p) + [1] * p + [1] * r + [0] * (R - r)
        ids = [10 + 10 * i + j if m else 9 for j, m in enumerate(mask)]
        rows.append(ids)
        masks.append(mask)
    ids, mask = torch.tensor(rows), torch.tensor(masks)
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def test_rows_are_front_aligned_and_trimmed():
    ids, mask, pos = _batch()
    inputs = build_inputs(ids, mask, pos, remove_padding=False)
    lens = mask.sum(-1)
    assert inputs.seq_length == int(lens.max()) == valid_length(mask)
    assert inputs.packed_seq_params is None
    for i in range(ids.shape[0]):
        n = int(lens[i])
        assert inputs.input_ids[i, :n].tolist() == ids[i][mask[i].bool()].tolist()
        assert inputs.position_ids[i, :n].tolist() == list(range(n))  # HF positions of the valid tokens
        assert inputs.token_mask[i].tolist() == [True] * n + [False] * (inputs.seq_length - n)


def test_length_rounds_up_for_sequence_parallel_and_rejects_too_short():
    ids, mask, pos = _batch()
    assert build_inputs(ids, mask, pos, remove_padding=False, pad_multiple=4).seq_length == 12
    assert build_inputs(ids, mask, pos, remove_padding=False, length=11).seq_length == 11
    with pytest.raises(ValueError, match="shorter than the longest row"):
        build_inputs(ids, mask, pos, remove_padding=False, length=5)


def test_predictions_map_back_to_the_response_tokens():
    """Per-position "prediction" = the next token; its response slice is the responses."""
    ids, mask, pos = _batch()
    responses, response_mask = ids[:, P:], mask[:, P:]
    for length in (None, 13):
        inputs = build_inputs(ids, mask, pos, remove_padding=False, length=length)
        got = to_response(next_token_labels(inputs).float(), inputs, R)
        assert torch.equal(got * response_mask, (responses * response_mask).float())


def test_response_values_reads_the_response_of_wide_values():
    """Per-position vectors (a vocabulary slice): the response positions hold each response token's
    next-token vector, as to_response's whole-row layout gives, and gradients flow back to them."""
    ids, mask, pos = _batch()
    responses, response_mask = ids[:, P:], mask[:, P:]
    inputs = build_inputs(ids, mask, pos, remove_padding=False, length=13)
    labels = next_token_labels(inputs).float()
    wide = torch.stack([labels, -labels, labels * 2], dim=-1).requires_grad_(True)  # [b, L, 3]
    got = response_values(wide, inputs, R)
    assert got.shape == (4, R, 3)
    assert torch.equal(got, to_response(wide, inputs, R))
    assert torch.equal(got[..., 1] * response_mask, -(responses * response_mask).float())
    got.sum().backward()
    # one per column at each valid position of the response window (a row's last token predicts padding)
    assert wide.grad.sum().item() == 3 * mask[:, P - 1 : P + R - 1].sum().item()


class _CPGroup:
    """Stands in for a context-parallel process group of `size` ranks, seen from `rank`."""

    def __init__(self, size: int, rank: int) -> None:
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


def test_context_parallel_padded_rows_give_each_rank_chunks_r_and_2c_minus_1_minus_r():
    """megatron's get_batch_on_this_cp_rank: CP=2 cuts a row of 12 into 4 chunks of 3; rank 0 holds
    chunks 0 and 3, rank 1 chunks 1 and 2 (model inputs and their next-token labels alike)."""
    ids, mask, pos = _batch()
    with pytest.raises(ValueError, match="multiple of 2 x context_parallel_size"):
        build_inputs(ids, mask, pos, remove_padding=False, pad_multiple=2, cp_group=_CPGroup(2, 0))
    expected = {0: [0, 1, 2, 9, 10, 11], 1: [3, 4, 5, 6, 7, 8]}
    for rank, columns in expected.items():
        inputs = build_inputs(ids, mask, pos, remove_padding=False, pad_multiple=4, length=12, cp_group=_CPGroup(2, rank))
        assert inputs.seq_length == 12  # megatron's schedules divide it by the CP size themselves
        assert torch.equal(inputs.local(inputs.input_ids), inputs.input_ids[:, columns])
        assert torch.equal(inputs.local(inputs.position_ids), inputs.position_ids[:, columns])
        labels = torch.roll(inputs.input_ids, -1, dims=1)[:, columns]
        assert torch.equal(next_token_labels(inputs), labels)


def test_context_parallel_packing_pads_each_row_to_2c_and_splits_it():
    """thd under CP=2: each row padded to a multiple of 4 (transformer-engine's per-sequence split),
    real lengths in cu_seqlens_q and padded offsets in cu_seqlens_q_padded; rank r holds chunks r
    and 3 - r of every row."""
    ids, mask, pos = _batch()
    lens = mask.sum(-1).tolist()  # [9, 3, 4, 5] -> padded [12, 4, 4, 8]
    padded = [12, 4, 4, 8]
    inputs = build_inputs(ids, mask, pos, remove_padding=True, pad_multiple=4, cp_group=_CPGroup(2, 1))
    params = inputs.packed_seq_params
    assert params.cu_seqlens_q.tolist() == [0, 9, 12, 16, 21]
    assert params.cu_seqlens_q_padded.tolist() == [0, 12, 16, 20, 28]
    assert params.max_seqlen_q == 12
    starts = [0, 12, 16, 20]
    for row, (start, n, p) in enumerate(zip(starts, lens, padded)):
        assert inputs.input_ids[0, start:start + n].tolist() == ids[row][mask[row].bool()].tolist()
        assert inputs.token_mask[0, start:start + p].tolist() == [True] * n + [False] * (p - n)
        assert inputs.position_ids[0, start:start + p].tolist() == list(range(p))
    # rank 1: chunk 1 and chunk 2 of each row (chunk = padded / 4)
    columns = [c for s, p in zip(starts, padded) for c in [*range(s + p // 4, s + p // 2), *range(s + p // 2, s + 3 * p // 4)]]
    assert torch.equal(inputs.local(inputs.input_ids), inputs.input_ids[:, columns])


def test_pad_inputs_adds_padding_rows_behind_the_rows():
    """Padded layout (VPP's one shape per pass): extra rows hold no token; the rows and the
    response mapping are unchanged; the row length cannot change (the CP split depends on it)."""
    ids, mask, pos = _batch()
    inputs = build_inputs(ids, mask, pos, remove_padding=False, length=12)
    padded = pad_inputs(inputs, 6, 12)
    assert padded.input_ids.shape == padded.position_ids.shape == padded.token_mask.shape == (6, 12)
    assert torch.equal(padded.input_ids[:4], inputs.input_ids) and torch.equal(padded.position_ids[:4], inputs.position_ids)
    assert not padded.token_mask[4:].any() and not padded.valid_mask[4:].any()
    got = to_response(next_token_labels(padded).float(), padded, R)
    assert torch.equal(got[:4] * mask[:, P:], (ids[:, P:] * mask[:, P:]).float()) and not got[4:].any()
    with pytest.raises(ValueError, match="keeps its row length 12"):
        pad_inputs(inputs, 6, 16)


@pytest.mark.parametrize("rank", [0, 1])
def test_pad_inputs_appends_a_packed_padding_segment_after_every_cp_ranks_tokens(rank):
    """thd under CP=2: 8 more tokens are one trailing segment (real = padded length 8, as
    build_inputs' dummy segment); each rank's tokens of the rows lead its local tokens, followed by
    its chunks 1/4 of the new segment, positions restarting at 0."""
    ids, mask, pos = _batch()
    inputs = build_inputs(ids, mask, pos, remove_padding=True, pad_multiple=4, cp_group=_CPGroup(2, rank))
    padded = pad_inputs(inputs, 1, 36)
    params = padded.packed_seq_params
    assert params.cu_seqlens_q.tolist() == params.cu_seqlens_kv.tolist() == [0, 9, 12, 16, 21, 29]
    assert params.cu_seqlens_q_padded.tolist() == params.cu_seqlens_kv_padded.tolist() == [0, 12, 16, 20, 28, 36]
    assert params.max_seqlen_q == 12
    local = padded.local(padded.input_ids)
    assert torch.equal(local[:, :14], inputs.local(inputs.input_ids))
    assert torch.equal(padded.local(padded.position_ids)[:, 14:], torch.tensor([[2 * rank, 2 * rank + 1, 6 - 2 * rank, 7 - 2 * rank]]))
    assert not local[:, 14:].any() and not padded.token_mask[:, 28:].any()
    assert pad_inputs(inputs, 1, 28) is inputs

