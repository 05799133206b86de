"""NaN end to end (CPU, Ray, real workers): an absurd actor lr (1e30) blows the weights up
in the first mini-batch step, so the second mini-batch's gradient is NaN. trainer.nan_policy=stop
(the default) ends the run with the worker's error naming global step 1, phase update_actor
and the mini-batch; nothing is checkpointed or logged for that step."""

from __future__ import annotations

import pytest

from fault_driver import overrides
from megarl.utils.checkpoint import read_tracker

pytestmark = pytest.mark.slow


def test_nan_loss_stops_the_run_naming_step_and_phase(demo_dir, tmp_path, monkeypatch):
    from megarl.config.compose import load_config
    from megarl.main_ppo import prepare
    from megarl.trainer import run_ppo
    from megarl.trainer.worker_group import WorkerError

    demo, run = demo_dir, tmp_path / "run"
    monkeypatch.setenv("MEGARL_DEMO_DIR", str(demo))
    args = [a for a in overrides(demo, run, ["trainer.total_training_steps=2", "trainer.save_freq=1",
                                             "actor_rollout_ref.actor.optim.lr=1e30"]) if not a.startswith("hydra.")]
    cfg = prepare(load_config(args))
    with pytest.raises(WorkerError) as info:
        run_ppo(cfg)
    message = str(info.value)
    assert "update_actor" in message and "NonFiniteError" in message, message[-3000:]
    assert "rank 0: ActorRolloutRefWorker.update_actor failed" in message
    # The blown-up weights make the gradient NaN (and, with longer responses, the loss too).
    assert ("non-finite loss/gradient at global step 1, phase update_actor (mini-batch 2 of 2): "
            "actor/grad_norm=nan") in message, message[-3000:]
    assert read_tracker(run / "ckpt") is None and not (run / "ckpt" / "global_step_1").exists()
    assert not (run / "ckpt" / "metrics.jsonl").exists() or not (run / "ckpt" / "metrics.jsonl").read_text().strip()
