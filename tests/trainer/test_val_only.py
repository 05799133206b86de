"""fit()'s control flow: trainer.val_only (verl: the validation before training is the whole run; no
step trains), val_before_train after a resume (verl validates then too), and the step time that the
progress line shows covering validation and checkpoint (issue 37 item 9)."""

from __future__ import annotations

from types import SimpleNamespace

from megarl.trainer.ppo_trainer import RayPPOTrainer


class _Tracking:
    def __init__(self):
        self.logged = []

    def log(self, metrics, step):
        self.logged.append((step, metrics))


class _Loader:
    def __init__(self, steps: int):
        self.steps, self.sampler = steps, SimpleNamespace(epoch=0)

    def __iter__(self):
        yield from range(self.steps)
        self.sampler.epoch += 1


def _trainer(val_only: bool) -> RayPPOTrainer:
    trainer = RayPPOTrainer.__new__(RayPPOTrainer)  # no Ray, no workers: fit()'s control flow only
    trainer.cfg = SimpleNamespace(trainer=SimpleNamespace(val_only=val_only, val_before_train=True, test_freq=-1,
                                                          save_freq=-1, total_epochs=1))
    trainer.global_step, trainer.total_steps = 0, 3
    trainer.phase = None
    trainer.val_loader = object()
    trainer.tracking = _Tracking()
    trainer.load_checkpoint = lambda: None
    trainer.validate = lambda: {"val/reward/mean": 0.5}
    trainer.train_loader = SimpleNamespace(sampler=SimpleNamespace(epoch=0), __iter__=None)
    trainer.sampler = None  # sync mode: no trainer.v1 sampler
    trainer.steps = []

    def train_step(prompts, it):
        trainer.steps.append(prompts)
        trainer.global_step += 1
        return {}

    trainer.train_step = train_step
    return trainer


def test_val_only_validates_and_trains_nothing():
    trainer = _trainer(val_only=True)
    assert trainer.fit() == {"val/reward/mean": 0.5}
    assert trainer.tracking.logged == [(0, {"val/reward/mean": 0.5})] and trainer.steps == [] and trainer.global_step == 0


def test_a_resumed_run_validates_before_training_at_its_step():
    trainer = _trainer(val_only=True)
    trainer.load_checkpoint = lambda: setattr(trainer, "global_step", 2)  # resumed at step 2
    trainer.fit()
    assert trainer.tracking.logged == [(2, {"val/reward/mean": 0.5})]


def test_step_time_includes_validation_and_checkpoint():
    import time

    trainer = _trainer(val_only=False)
    trainer.cfg.trainer = SimpleNamespace(val_only=False, val_before_train=False, test_freq=1, save_freq=1, total_epochs=1)
    trainer.train_loader = _Loader(3)
    trainer.train_step = lambda prompts, it: {"timing_s/update_actor": 0.0}
    trainer.validate = lambda: time.sleep(0.05) or {"val/reward/mean": 0.5}
    trainer.save_checkpoint = lambda: time.sleep(0.05)
    trainer.fit()
    for step, metrics in trainer.tracking.logged:
        assert metrics["timing_s/testing"] >= 0.05 and metrics["timing_s/save_checkpoint"] >= 0.05, metrics
        assert metrics["timing_s/step"] >= metrics["timing_s/testing"] + metrics["timing_s/save_checkpoint"], metrics
