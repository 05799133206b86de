import pytest
import torch

from megarl.algorithms import GlobalDenominator, agg_loss
from megarl.config.names import LOSS_AGG_MODES

# Ragged mask: lengths 3, 1, 0 (an all-padding row), 2.
LOSS = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0], [9.0, 9.0, 9.0, 9.0], [5.0, 6.0, 9.0, 9.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0]])


@pytest.mark.parametrize(
    "mode,expected",
    [
        ("token-mean", (1 + 2 + 3 + 4 + 5 + 6) / 6),
        ("token-sum", 21.0),
        ("seq-mean-token-sum", (6 + 4 + 11) / 3),
        ("seq-mean-token-mean", (2 + 4 + 5.5) / 3),
        ("seq-mean-token-sum-norm", (6 + 4 + 11) / 3 / 4),
    ],
)
def test_modes_match_hand_formulas_on_ragged_mask(mode, expected):
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected)


def test_seq_mean_token_sum_norm_uses_loss_scale_factor():
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=7).item() == pytest.approx(7 / 7)


def test_masked_entries_never_leak():
    perturbed = LOSS.clone()
    perturbed[MASK == 0] = float("nan")
    for mode in LOSS_AGG_MODES:
        assert agg_loss(perturbed, MASK, mode).item() == pytest.approx(agg_loss(LOSS, MASK, mode).item())


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batch_split_invariance_with_global_denominator(mode):
    torch.manual_seed(0)
    loss = torch.randn(8, 5, requires_grad=True)
    lengths = torch.tensor([5, 1, 0, 3, 2, 4, 5, 1])
    mask = (torch.arange(5)[None, :] < lengths[:, None]).long()
    whole = agg_loss(loss, mask, mode)
    (g_whole,) = torch.autograd.grad(whole, loss)
    # Uneven split into micro-batches of 3, 1, 4 rows; two "DP ranks" hold 2 chunks each.
    chunks = [slice(0, 3), slice(3, 4), slice(4, 8)]
    denom = GlobalDenominator(0, 0)
    for c in chunks:
        denom = denom + GlobalDenominator.from_mask(mask[c])
    assert denom.num_tokens == 21 and denom.num_seqs == 7
    denom = GlobalDenominator.from_tensor(denom.to_tensor())  # the all-reduce round trip
    total = sum(agg_loss(loss[c], mask[c], mode, global_denominator=denom) for c in chunks)
    (g_split,) = torch.autograd.grad(total, loss)
    assert total.item() == pytest.approx(whole.item(), rel=1e-6)
    assert torch.allclose(g_split, g_whole, atol=1e-7)
    # A plain number in the unit of the mode works the same way.
    number = {"token-mean": 21, "token-sum": None}.get(mode, 7)
    total_n = sum(agg_loss(loss[c], mask[c], mode, global_denominator=number) for c in chunks)
    assert total_n.item() == pytest.approx(whole.item(), rel=1e-6)


def test_without_global_denominator_split_is_not_invariant():
    # Guards the test above: local means of unequal micro-batches differ from the global mean.
    loss = torch.tensor([[1.0, 1.0], [3.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    whole = agg_loss(loss, mask, "token-mean").item()
    split = sum(agg_loss(loss[i : i + 1], mask[i : i + 1], "token-mean").item() for i in range(2)) / 2
    assert whole == pytest.approx(5 / 3) and split == pytest.approx(2.0)


def test_unknown_mode_lists_valid_modes():
    with pytest.raises(ValueError, match="token-mean") as e:
        agg_loss(LOSS, MASK, "token-avg")
    assert "loss_agg_mode" in str(e.value)


def test_all_masked_minibatch_gives_zero_loss():
    zeros = torch.zeros(2, 3, dtype=torch.long)
    for mode in LOSS_AGG_MODES:
        assert agg_loss(LOSS[:2, :3], zeros, mode).item() == 0.0
        assert agg_loss(LOSS[:2, :3], zeros, mode, global_denominator=GlobalDenominator(0, 0)).item() == 0.0
