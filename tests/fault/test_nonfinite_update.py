"""NaN/Inf in an actor or critic update (real Megatron workers on CPU, one rank):
stop names the step and phase and leaves the weights of the last finite step; skip drops
exactly the non-finite optimizer step."""

from __future__ import annotations

import math

import pytest
import torch

from helpers.dist_utils import run_distributed
from helpers.tiny import make_tiny_qwen2, rollout_batch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    from nonfinite_bodies import nonfinite_updates

    model = make_tiny_qwen2(str(tmp_path_factory.mktemp("model")))
    return run_distributed(nonfinite_updates, 1, model, rollout_batch(8), timeout=400)[0]


def test_actor_stop_names_step_and_phase_and_keeps_weights(result):
    error = result["actor_error"]
    assert error is not None, "a NaN advantage did not stop the update"
    assert "global step 5" in error and "phase update_actor" in error and "mini-batch 1 of 2" in error
    assert "actor/grad_norm=nan" in error and "trainer.nan_policy=skip" in error
    assert result["actor_unchanged"]


def test_actor_skip_drops_exactly_the_nonfinite_step(result):
    metrics = result["skip_metrics"]
    assert metrics["actor/nonfinite_skipped_steps"] == 1.0
    assert all(math.isfinite(v) for v in metrics.values())
    # reference: an update on the finite mini-batch alone
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss"):
        assert metrics[key] == pytest.approx(result["reference_metrics"][key], rel=1e-6), key
    got, want = result["skip_weights"], result["reference_weights"]
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=0, msg=name)
    assert any(not torch.equal(want[n], result["initial_weights"][n]) for n in want)  # it did train


def test_critic_reports_grad_norm_without_clipping_and_stops_on_inf(result):
    norm = result["critic_metrics"]["critic/grad_norm"]
    assert math.isfinite(norm) and norm > 0  # clip_grad=0: megatron returns no norm; the guard does
    error = result["critic_error"]
    assert error is not None and "critic:" in error and "global step 7" in error and "phase update_critic" in error
    assert "critic/grad_norm=" in error


def test_inf_weight_stops_the_actor_update(result):
    error = result["weight_error"]
    assert error is not None and "global step 9" in error and "phase update_actor" in error
    assert "mini-batch 1 of 2" in error and "actor/pg_loss=nan" in error
