"""trainer.val_only (verl): the validation before training is the whole run; no step trains."""

from __future__ import annotations

from types import SimpleNamespace

from megarl.trainer.ppo_trainer import RayPPOTrainer


class _Tracking:
    def __init__(self):
        self.logged = []

    def log(self, metrics, step):
        self.logged.append((step, metrics))


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
