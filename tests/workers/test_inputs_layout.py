"""The padded layout of megarl.workers.megatron.inputs: rows front-aligned, no attention mask.

Reference: the rows' own tokens (the HF batch), not the module's output.
"""

from __future__ import annotations

import pytest
import torch

from megarl.workers.megatron.inputs import build_inputs, next_token_labels, to_response, valid_length

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
