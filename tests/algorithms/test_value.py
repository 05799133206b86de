import pytest
import torch

from megarl.algorithms.value import compute_value_loss, explained_variance


def test_clipped_value_loss_by_hand():
    vpreds = torch.tensor([[1.0, 0.0, 5.0]], requires_grad=True)
    values = torch.tensor([[0.0, 0.0, 0.0]])
    returns = torch.tensor([[0.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    # tok0: unclipped (1-0)^2=1, clipped clip(1, -0.5, 0.5)=0.5 -> 0.25; max 1 (not clipped)
    # tok1: unclipped 1, clipped 0 -> (0-1)^2=1; equal -> not counted as clipped
    loss, clipfrac = compute_value_loss(vpreds, returns, values, mask, 0.5, "token-mean")
    assert loss.item() == pytest.approx(0.5 * (1 + 1) / 2)
    assert clipfrac == 0.0
    # tok0 with return 2: unclipped (1-2)^2 = 1, clipped (0.5-2)^2 = 2.25 -> clipped term wins
    loss2, clipfrac2 = compute_value_loss(vpreds, torch.tensor([[2.0, 1.0, 0.0]]), values, mask, 0.5, "token-mean")
    assert loss2.item() == pytest.approx(0.5 * (2.25 + 1) / 2)
    assert clipfrac2 == pytest.approx(0.5)


def test_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    assert explained_variance(returns.clone(), returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.zeros(1, 4), returns, mask) == pytest.approx(0.0, abs=1e-6)
    # residual [0, 0, 1]: var 1/3; var(returns)=1 -> 1 - 1/3
    assert explained_variance(torch.tensor([[1.0, 2.0, 2.0, 0.0]]), returns, mask) == pytest.approx(2 / 3)
