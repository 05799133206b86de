import math

import pytest
import torch

from megarl.algorithms import masked_mean, masked_sum, masked_var, masked_whiten

VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, float("nan"), float("inf")]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


def test_masked_sum_and_mean_ignore_nan_and_inf_outside_mask():
    assert masked_sum(VALUES, MASK).item() == 7.0
    assert masked_mean(VALUES, MASK).item() == pytest.approx(7.0 / 3)
    assert masked_sum(VALUES, MASK, dim=-1).tolist() == [3.0, 4.0]
    assert masked_mean(VALUES, MASK, dim=-1).tolist() == [1.5, 4.0]


def test_masked_mean_of_empty_row_is_zero():
    assert masked_mean(torch.ones(2, 3), torch.tensor([[1, 0, 0], [0, 0, 0]]), dim=-1).tolist() == [1.0, 0.0]


def test_masked_var_biased_and_unbiased():
    # valid values 1, 2, 4: mean 7/3, squared deviations 16/9 + 1/9 + 25/9 = 42/9
    assert masked_var(VALUES, MASK, unbiased=False).item() == pytest.approx(42 / 9 / 3)
    assert masked_var(VALUES, MASK).item() == pytest.approx(42 / 9 / 2)
    with pytest.raises(ValueError):
        masked_var(torch.ones(1, 2), torch.tensor([[1, 0]]))


def test_masked_whiten():
    out = masked_whiten(VALUES, MASK)
    std = math.sqrt(42 / 9 / 2 + 1e-8)
    expect = [[(1 - 7 / 3) / std, (2 - 7 / 3) / std, 0.0], [(4 - 7 / 3) / std, 0.0, 0.0]]
    assert torch.allclose(out, torch.tensor(expect), atol=1e-6)
    kept = masked_whiten(VALUES, MASK, shift_mean=False)
    assert kept[0, 0].item() == pytest.approx((1 - 7 / 3) / std + 7 / 3, rel=1e-6)
