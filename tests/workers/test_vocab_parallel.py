"""Vocab-parallel log-prob / entropy / sum of squared probabilities against a full-vocabulary
torch reference."""

import pytest
import torch

from helpers.dist_utils import run_distributed


def _reference(logits, target, temperature):
    # -1e4 stands in for -inf (zero probability) so the reference has no 0 * inf.
    z = logits.double().clamp_min(-1e4) / temperature
    logp_all = torch.log_softmax(z, dim=-1)
    logp = logp_all.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy, logp_all.exp().square().sum(-1)


def _inputs():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 12, generator=gen) * 3
    logits[..., -2:] = float("-inf")  # vocab padding rows (masked by the model)
    target = torch.randint(0, 10, (3, 5), generator=gen)
    weights = torch.randn(3, 5, generator=gen)
    return logits, target, weights


def _body(tp: int, temperature: float):
    from megarl.parallel import init_distributed
    from megarl.workers.megatron.vocab_parallel import vocab_parallel_token_stats
    from megatron.core import parallel_state

    init_distributed({"tensor_model_parallel_size": tp}, "cpu", seed=42)
    logits, target, weights = _inputs()
    rank = parallel_state.get_tensor_model_parallel_rank()
    shard = logits.chunk(tp, dim=-1)[rank].clone().requires_grad_(True)
    logp, ent, spp = vocab_parallel_token_stats(shard, target, temperature=temperature, compute_sum_pi_squared=True)
    ((logp * weights).sum() + (ent * weights.flip(0)).sum()).backward()
    return logp.detach(), ent.detach(), spp, shard.grad


@pytest.mark.slow
@pytest.mark.parametrize("tp", [1, 2])
def test_matches_full_vocab_reference(tp):
    temperature = 0.7
    logits, target, weights = _inputs()
    ref_logp, ref_ent, ref_spp = _reference(logits, target, temperature)
    full = logits.double().clone().requires_grad_(True)
    rl, re, _ = _reference(full, target, temperature)
    ((rl * weights).sum() + (re * weights.flip(0)).sum()).backward()
    ref_grad = full.grad

    results = run_distributed(_body, tp, tp, temperature, timeout=120)
    grads = torch.cat([g for *_, g in results], dim=-1)
    for logp, ent, spp, _ in results:
        torch.testing.assert_close(logp.double(), ref_logp, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ent.double(), ref_ent, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(spp.double(), ref_spp, atol=1e-6, rtol=1e-5)
    assert torch.isfinite(grads).all()
    torch.testing.assert_close(grads.double(), ref_grad, atol=1e-5, rtol=1e-5)
