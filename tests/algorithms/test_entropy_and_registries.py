import math

import pytest
import torch

import megarl.algorithms as A
from megarl.config.names import KL_PENALTIES, LOSS_AGG_MODES


def test_entropy_from_logits_by_hand():
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [1.0, 1e-12, 1e-12]]])) + 2.0
    ent = A.entropy_from_logits(logits)
    assert ent.shape == (1, 2)
    assert ent[0, 0].item() == pytest.approx(-(0.5 * math.log(0.5) + 0.5 * math.log(0.25)), rel=1e-5)
    assert ent[0, 1].item() == pytest.approx(0.0, abs=1e-6)


def test_entropy_loss_and_combined_actor_loss():
    ent = torch.tensor([[1.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 0]])
    e = A.compute_entropy_loss(ent, mask, "token-mean")
    assert e.item() == 2.0
    total = A.combine_actor_loss(torch.tensor(1.0), e, entropy_coeff=0.01, kl_loss=torch.tensor(0.5), kl_loss_coef=0.1)
    assert total.item() == pytest.approx(1.0 - 0.02 + 0.05)


def test_name_views_are_complete_and_live():
    assert {"gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "opo", "gpg",
            "grpo_passk", "gdpo", "optimal_token_baseline"} <= set(A.ADV_ESTIMATORS)
    assert {"vanilla", "clip_cov", "kl_cov", "gpg", "gspo", "sapo", "cispo", "geo_mean", "dppo_tv", "dppo_kl",
            "dro", "bypass_mode"} <= set(A.POLICY_LOSSES)
    assert set(LOSS_AGG_MODES) >= {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"}
    assert {"kl", "abs", "mse", "low_var_kl", "full"} <= set(KL_PENALTIES)

    from megarl.algorithms.policy_loss_base import POLICY_LOSS_REGISTRY

    @A.register_policy_loss("_test_custom")
    def custom(*args, **kwargs):
        return torch.tensor(0.0), {}

    try:
        assert "_test_custom" in A.POLICY_LOSSES and A.get_policy_loss("_test_custom") is custom
    finally:
        POLICY_LOSS_REGISTRY._table.pop("_test_custom")


@pytest.mark.parametrize(
    "getter,bad,key",
    [
        (A.get_adv_estimator, "ppo", "algorithm.adv_estimator"),
        (A.get_policy_loss, "grpo", "policy_loss.loss_mode"),
    ],
)
def test_unknown_names_raise_with_valid_list(getter, bad, key):
    with pytest.raises(ValueError) as e:
        getter(bad)
    msg = str(e.value)
    assert key in msg and "Valid: [" in msg
