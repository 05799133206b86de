"""Distillation losses against hand-derived formulas and a dense full-vocabulary computation: the
estimators, the vocab-parallel top-k forward KL (TP=1 and TP=2, value and gradient), the teacher's
vocab-parallel top-k, and verl's combination keys (use_policy_gradient, use_task_rewards,
distillation_loss_coef, loss_max_clamp)."""

from __future__ import annotations

import pytest
import torch

from algo_config import actor, project, with_values
from helpers.dist_utils import run_distributed
from megarl.algorithms import GlobalDenominator
from megarl.algorithms.distillation import combine_with_policy_loss, distillation_objective, estimator_losses


def loss_config(**values):
    return with_values(project().distillation.distillation_loss, values)


def _pair():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(3, 4, generator=gen) - 2, torch.randn(3, 4, generator=gen) - 2


@pytest.mark.parametrize("mode, formula", [
    ("k1", lambda s, t: s - t),
    ("kl", lambda s, t: s - t),
    ("abs", lambda s, t: (s - t).abs()),
    ("k2", lambda s, t: 0.5 * (s - t) ** 2),
    ("mse", lambda s, t: 0.5 * (s - t) ** 2),
    ("k3", lambda s, t: torch.exp(t - s) - (t - s) - 1),
    ("low_var_kl", lambda s, t: torch.exp(t - s) - (t - s) - 1),
])
def test_estimators_match_hand_formulas(mode, formula):
    student, teacher = _pair()
    torch.testing.assert_close(estimator_losses(student, teacher, mode), formula(student, teacher))


def test_loss_modes_differ():
    student, teacher = _pair()
    values = {m: estimator_losses(student, teacher, m).sum().item() for m in ("k1", "abs", "k2", "k3")}
    assert len(set(values.values())) == 4


def _objective(losses, mask, logp_value: float = 0.0, **values):
    cfg = loss_config(**values)
    old = torch.zeros_like(losses)
    logp = torch.full_like(losses, logp_value, requires_grad=True)
    loss, metrics = distillation_objective(
        losses, mask, cfg, "token-mean", GlobalDenominator.from_mask(mask),
        pg_config=actor(clip_ratio=cfg.clip_ratio, clip_ratio_low=cfg.clip_ratio_low, clip_ratio_high=cfg.clip_ratio_high,
                        clip_ratio_c=3.0, loss_scale_factor=None),
        old_log_prob=old, log_prob=logp,
    )
    return loss, metrics, logp


def test_backpropagated_loss_is_token_mean_and_clamped():
    losses = torch.tensor([[0.5, 20.0, -3.0], [1.0, 2.0, 7.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    loss, metrics, _ = _objective(losses, mask, use_policy_gradient=False, loss_max_clamp=None)
    assert loss.item() == pytest.approx((0.5 + 20 - 3 + 1 + 2) / 5)
    assert metrics["distillation/loss_min"] == -3.0 and metrics["distillation/loss_max"] == 20.0
    clamped, _, _ = _objective(losses, mask, use_policy_gradient=False, loss_max_clamp=2.0)
    assert clamped.item() == pytest.approx((0.5 + 2 - 2 + 1 + 2) / 5)


def test_policy_gradient_uses_minus_loss_as_advantage():
    """At ratio 1 the vanilla PPO loss is mean(-A) = mean(loss), and d/d log pi = -A / n = loss / n."""
    losses = torch.tensor([[0.5, 2.0, -3.0], [1.0, 2.0, 7.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    loss, metrics, logp = _objective(losses, mask, use_policy_gradient=True, loss_max_clamp=None)
    assert loss.item() == pytest.approx((0.5 + 2 - 3 + 1 + 2) / 5)
    loss.backward()
    torch.testing.assert_close(logp.grad, losses.detach() * mask / 5)
    assert losses.grad is None or not losses.grad.any()  # the advantage is detached
    assert "distillation/pg_clipfrac" in metrics


def test_policy_gradient_clips_with_the_distillation_clip_ratios():
    """ratio e^0.5 ~ 1.65 with advantage -loss > 0 (losses < 0): PPO takes min(r, 1 + clip_ratio_high) x A."""
    losses = torch.full((2, 3), -1.0)
    mask = torch.ones(2, 3)
    ratio = torch.tensor(0.5).exp().item()
    for high in (0.2, 0.4):
        loss, metrics, _ = _objective(losses, mask, 0.5, use_policy_gradient=True, loss_max_clamp=None,
                                      clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=high)
        assert loss.item() == pytest.approx(-min(ratio, 1 + high))
        assert metrics["distillation/pg_clipfrac"] == 1.0


def test_task_rewards_and_coef_combine_as_verl():
    policy, distil = torch.tensor(2.0), torch.tensor(3.0)
    assert combine_with_policy_loss(policy, distil, loss_config(use_task_rewards=True, distillation_loss_coef=0.5)).item() == 3.5
    assert combine_with_policy_loss(policy, distil, loss_config(use_task_rewards=True, distillation_loss_coef=2.0)).item() == 8.0
    assert combine_with_policy_loss(policy, distil, loss_config(use_task_rewards=False, distillation_loss_coef=2.0)).item() == 3.0


# ---------------------------------------------------------------- vocab-parallel top-k
VOCAB, K, TEMP, CLAMP = 12, 4, 0.8, -3.0


def _topk_inputs():
    gen = torch.Generator().manual_seed(1)
    student = torch.randn(2, 3, VOCAB, generator=gen) * 2
    teacher = torch.randn(2, 3, VOCAB, generator=gen) * 2
    t_logp, t_ids = torch.log_softmax(teacher / TEMP, -1).topk(K, dim=-1)
    weights = torch.rand(2, 3, generator=gen)
    return student, teacher, t_logp, t_ids, weights


def _dense_forward_kl(student, t_logp, t_ids, clamp):
    """The formula on the full vocabulary in float64: sum_i p_i (log p_i - log q_i) over the teacher's top-k."""
    logq = torch.log_softmax(student.double() / TEMP, -1).gather(-1, t_ids)
    logp = t_logp.double()
    if clamp is not None:
        logp, logq = logp.clamp_min(clamp), logq.clamp_min(clamp)
    return (logp.exp() * (logp - logq)).sum(-1), logq.exp().sum(-1)


def _topk_body(tp, clamp):
    from megarl.parallel import init_distributed
    from megarl.workers.megatron.vocab_topk import vocab_parallel_forward_kl_topk, vocab_parallel_topk_log_probs
    from megatron.core import parallel_state

    init_distributed({"tensor_model_parallel_size": tp}, "cpu", seed=42)
    student, teacher, t_logp, t_ids, weights = _topk_inputs()
    rank = parallel_state.get_tensor_model_parallel_rank()
    shard = student.chunk(tp, dim=-1)[rank].clone().requires_grad_(True)
    loss, s_mass, t_mass = vocab_parallel_forward_kl_topk(shard, t_logp, t_ids, temperature=TEMP, log_prob_min_clamp=clamp)
    (loss * weights).sum().backward()
    top_logp, top_ids = vocab_parallel_topk_log_probs(teacher.chunk(tp, dim=-1)[rank], K, temperature=TEMP)
    return loss.detach(), s_mass, t_mass, shard.grad, top_logp, top_ids


@pytest.mark.slow
@pytest.mark.parametrize("tp, clamp", [
    (2, CLAMP),
    pytest.param(1, CLAMP, marks=pytest.mark.extended),
    pytest.param(2, None, marks=pytest.mark.extended),
    pytest.param(1, None, marks=pytest.mark.extended),
])
def test_forward_kl_topk_vocab_parallel_equals_dense(tp, clamp):
    """TP=2 and TP=1 each equal the dense full-vocabulary formula (so each other)."""
    student, teacher, t_logp, t_ids, weights = _topk_inputs()
    full = student.double().clone().requires_grad_(True)
    ref_loss, ref_mass = _dense_forward_kl(full, t_logp, t_ids, clamp)
    (ref_loss * weights).sum().backward()
    results = run_distributed(_topk_body, tp, tp, clamp, timeout=120)
    grad = torch.cat([r[3] for r in results], dim=-1)
    torch.testing.assert_close(grad.double(), full.grad, atol=1e-5, rtol=1e-5)
    for loss, s_mass, t_mass, _, top_logp, top_ids in results:
        torch.testing.assert_close(loss.double(), ref_loss.detach(), atol=1e-5, rtol=1e-5)
        if clamp is None:
            torch.testing.assert_close(s_mass.double(), ref_mass.detach(), atol=1e-5, rtol=1e-5)
        clamped = t_logp if clamp is None else t_logp.clamp_min(clamp)  # verl: the mass of the clamped top-k
        torch.testing.assert_close(t_mass, clamped.exp().sum(-1))
        torch.testing.assert_close(top_logp, t_logp)  # the teacher's vocab-parallel top-k = torch.topk of the full softmax
        assert torch.equal(top_ids, t_ids)


class _OneRank:
    """A one-rank tensor-parallel group: the vocab-parallel functions in-process, no collective."""

    def size(self) -> int:
        return 1


def test_topk_key_changes_the_loss():
    """distillation_loss.topk: the teacher keeps k log-probs, and the KL sums over those k."""
    from megarl.workers.megatron.vocab_topk import vocab_parallel_forward_kl_topk, vocab_parallel_topk_log_probs

    student, teacher, *_ = _topk_inputs()
    losses = {}
    for k in (2, 6):
        t_logp, t_ids = vocab_parallel_topk_log_probs(teacher, k, temperature=TEMP, tp_group=_OneRank())
        assert t_logp.shape == (2, 3, k)
        losses[k], _, _ = vocab_parallel_forward_kl_topk(student, t_logp, t_ids, temperature=TEMP, tp_group=_OneRank())
        torch.testing.assert_close(losses[k].double(), _dense_forward_kl(student, t_logp, t_ids, None)[0].float().double(),
                                   atol=1e-5, rtol=1e-5)
    assert not torch.allclose(losses[2], losses[6])
