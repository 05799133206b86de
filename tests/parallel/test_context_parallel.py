"""megarl.parallel.context_parallel.cp_token_index against hand-written chunk lists (megatron's
get_batch_on_this_cp_rank: rank r holds chunks r and 2c-1-r; packed sequences each split alike)."""

from __future__ import annotations

import pytest

from megarl.parallel.context_parallel import cp_token_index


def test_one_sequence_cp2_and_cp3():
    # 8 tokens, 4 chunks of 2: rank 0 chunks 0 and 3, rank 1 chunks 1 and 2
    assert cp_token_index([8], 2).tolist() == [[0, 1, 6, 7], [2, 3, 4, 5]]
    # 6 tokens, 6 chunks of 1: rank r holds r and 5 - r
    assert cp_token_index([6], 3).tolist() == [[0, 5], [1, 4], [2, 3]]


def test_packed_sequences_are_split_one_by_one():
    # [4 | 8] at CP=2: chunks of 1 and of 2, the second sequence starting at 4
    assert cp_token_index([4, 8], 2).tolist() == [[0, 3, 4, 5, 10, 11], [1, 2, 6, 7, 8, 9]]


def test_lengths_must_split_into_2cp_chunks():
    with pytest.raises(ValueError, match="6 tokens does not split into 2 x cp = 4 chunks"):
        cp_token_index([8, 6], 2)
    assert cp_token_index([], 2).shape == (2, 0)
