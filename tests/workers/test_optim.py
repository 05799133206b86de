"""verl's optimizer / scheduler keys (`*.optim`, McoreOptimizerConfig) change what megarl builds.

Megatron optimizers and lr schedules are built by `MegatronEngine` (tiny Qwen2, one process, no
Ray) from `load_config(CPU_SMALL + overrides)`; the lr / weight-decay sequences are compared with
values derived by hand from the schedule definitions (warmup lr_warmup_init -> lr, then
linear / cosine / inverse-square-root / WSD down to min_lr at lr_decay_steps), the optimizer with
the keys (torch optimizer class, betas, eps, momentum). Keys megarl cannot honour on this machine
are refused by config rules naming the key.
"""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

from helpers.cpu_config import CPU_SMALL
from helpers.dist_utils import run_distributed
from optim_bodies import resume, schedules
from helpers.tiny import make_tiny_qwen2

from megarl.config import collect_issues, load_config

O = "actor_rollout_ref.actor.optim"
M = "actor_rollout_ref.actor.megatron"


def _o(**values) -> list[str]:
    return [f"{O}.{k}={v}" for k, v in values.items()]


def _ov(**fields) -> list[str]:
    """`override_optimizer_config` entries, given as verl users do (`+...override_optimizer_config.x=v`)."""
    return [f"+{O}.override_optimizer_config.{k}={v}" for k, v in fields.items()]


COS = lambda x: 0.5 * (1 + math.cos(math.pi * x))  # noqa: E731  cosine coefficient at decay fraction x

# name -> (overrides, steps recorded) and the lr of the default group at steps 0, 1, ..., by hand.
LR_CASES = {
    # warmup 0.2 -> 1.0 over 2 steps, then linear to min_lr=0.1 at step 6 (= total), then min_lr.
    "warmup_init_linear": (_o(lr=1.0, lr_warmup_init=0.2, lr_warmup_steps=2, lr_decay_style="linear", min_lr=0.1,
                              total_training_steps=6), [0.2, 0.6, 1.0, 0.775, 0.55, 0.325, 0.1, 0.1]),
    # lr_warmup_steps <= 0: warmup = int(ratio * 8) = 2 steps from 0, then linear to 0 at step 8.
    "warmup_ratio": (_o(lr=1.0, lr_warmup_steps=-1, lr_warmup_steps_ratio=0.25, lr_decay_style="linear",
                        total_training_steps=8), [0, 0.5, 1, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6, 0, 0]),
    "warmup_ratio_zero_steps": (_o(lr=1.0, lr_warmup_steps=0, lr_warmup_steps_ratio=0.25, lr_decay_style="linear",
                                   total_training_steps=8), [0, 0.5, 1, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6, 0, 0]),
    # lr_decay_steps=4 ends the cosine at step 4 although the run is 10 steps long.
    "cosine_decay_steps": (_o(lr=1.0, lr_decay_style="cosine", min_lr=0.2, lr_decay_steps=4, total_training_steps=10),
                           [1.0, 0.2 + 0.8 * COS(0.25), 0.6, 0.2 + 0.8 * COS(0.75), 0.2, 0.2, 0.2]),
    "cosine_total": (_o(lr=1.0, lr_decay_style="cosine", min_lr=0.2, total_training_steps=8),
                     [0.2 + 0.8 * COS(s / 8) for s in range(9)] + [0.2]),
    # lr * sqrt(warmup / step) after a 4-step warmup, floored at min_lr=0.45 (from step 20).
    "inverse_sqrt": (_o(lr=1.0, lr_decay_style="inverse-square-root", lr_warmup_steps=4, min_lr=0.45,
                        total_training_steps=100),
                     [s / 4 for s in range(5)] + [max(0.45, math.sqrt(4 / s)) for s in range(5, 22)]),
    # WSD: constant 1.0 until step 10 - 4, then the last 4 steps (to step 10) decay to 0.
    "wsd_linear": (_o(lr=1.0, lr_decay_style="WSD", lr_wsd_decay_style="linear", lr_wsd_decay_steps=4,
                      total_training_steps=10), [1.0] * 7 + [0.75, 0.5, 0.25, 0.0, 0.0]),
    "wsd_short": (_o(lr=1.0, lr_decay_style="WSD", lr_wsd_decay_style="linear", lr_wsd_decay_steps=2,
                     total_training_steps=10), [1.0] * 9 + [0.5, 0.0]),
    "wsd_exponential": (_o(lr=1.0, lr_decay_style="WSD", lr_wsd_decay_style="exponential", lr_wsd_decay_steps=4,
                           total_training_steps=10), [1.0] * 7 + [2 * 0.5 ** (r / 4) - 1 for r in range(1, 5)]),
    "wsd_cosine": (_o(lr=1.0, lr_decay_style="WSD", lr_wsd_decay_style="cosine", lr_wsd_decay_steps=4,
                      total_training_steps=10), [1.0] * 7 + [COS(r / 4) for r in range(1, 5)]),
    "wsd_minus_sqrt": (_o(lr=1.0, lr_decay_style="WSD", lr_wsd_decay_style="minus_sqrt", lr_wsd_decay_steps=4,
                          total_training_steps=10), [1.0] * 7 + [1 - math.sqrt(r / 4) for r in range(1, 5)]),
    "constant": (_o(lr=0.3, lr_warmup_steps=1, min_lr=0.1, total_training_steps=4), [0.0, 0.3, 0.3, 0.3, 0.3, 0.3]),
}
# Weight decay: `weight_decay` on the default group, 0 on biases / norms, for every increment style
# (verl builds the schedule with start = end = weight_decay).
WD_CASES = {
    f"wd_{style}": (_o(weight_decay=0.05, weight_decay_incr_style=style, lr_decay_style="linear", total_training_steps=4), 6)
    for style in ("constant", "linear", "cosine")
}
OPTIMIZER_CASES = {
    "adam": (_o(optimizer="adam", betas="[0.8,0.95]", clip_grad=0.5, min_lr=1e-7, weight_decay=0.02)
             + _ov(adam_eps=1e-5), 1),
    "adam_defaults": ([], 1),
    "sgd": (_o(optimizer="sgd") + _ov(sgd_momentum=0.5), 1),
    # decoupled_lr: the embedding / output group peaks at 0.5 and follows the same linear decay.
    "decoupled_lr": (_o(lr=1.0, lr_decay_style="linear", total_training_steps=4)
                     + _ov(decoupled_lr=0.5, decoupled_min_lr=0.1), 5),
}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return make_tiny_qwen2(str(tmp_path_factory.mktemp("optim") / "model"), num_layers=1)


@pytest.fixture(scope="module")
def built(model_path):
    cases = {name: (o, len(lrs)) for name, (o, lrs) in LR_CASES.items()} | WD_CASES | OPTIMIZER_CASES
    return run_distributed(schedules, 1, model_path, cases, timeout=600)[0]


@pytest.mark.parametrize("name", sorted(LR_CASES))
def test_lr_sequence_matches_hand_derived(built, name):
    want = LR_CASES[name][1]
    seq = built[name]["seq"]
    assert seq["lr_decay"] == pytest.approx(want, abs=1e-9)
    assert seq["lr_no_decay"] == pytest.approx(want, abs=1e-9)  # one schedule for every group


@pytest.mark.parametrize("name", sorted(WD_CASES))
def test_weight_decay_sequence(built, name):
    seq = built[name]["seq"]
    assert seq["wd_decay"] == pytest.approx([0.05] * 6)
    assert seq["wd_no_decay"] == [0.0] * 6
    assert built["adam_defaults"]["seq"]["wd_decay"] == pytest.approx([0.01])  # the yaml's weight_decay


def test_optimizer_config_follows_keys(built):
    adam, default, sgd = built["adam"], built["adam_defaults"], built["sgd"]
    assert adam["config"] | {"adam_eps": pytest.approx(1e-5)} == {
        "optimizer": "adam", "lr": 1e-6, "min_lr": 1e-7, "weight_decay": 0.02, "adam_beta1": 0.8, "adam_beta2": 0.95,
        "adam_eps": pytest.approx(1e-5), "clip_grad": 0.5, "sgd_momentum": 0.9, "decoupled_lr": None,
        "use_precision_aware_optimizer": False,
    }
    # the torch optimizer megatron built (CPU: torch.optim) carries them
    assert adam["torch_class"] == "AdamW" and adam["torch_group"] == {"betas": (0.8, 0.95), "eps": pytest.approx(1e-5)}
    assert default["torch_group"] == {"betas": (0.9, 0.999), "eps": 1e-8}  # the yaml's betas, megatron's eps
    assert sgd["torch_class"] == "SGD" and sgd["torch_group"] == {"momentum": 0.5}


def test_decoupled_lr_override_has_its_own_schedule(built):
    seq = built["decoupled_lr"]["seq"]
    assert seq["lr_decay"] == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])
    assert seq["lr_decoupled"] == pytest.approx([0.1 + 0.4 * (1 - s / 4) for s in range(5)])


def test_use_checkpoint_opt_param_scheduler_on_resume(model_path, tmp_path):
    """Saved after 4 steps of lr 1.0 linear over 10 steps; resumed with lr 2.0 linear over 20.
    true: the checkpoint's schedule continues (1 - s/10); false: the config's (2 (1 - s/20)), at
    step 4 either way - with and without the optimizer state (which carries the groups' lr)."""
    saved = _o(lr=1.0, lr_decay_style="linear", total_training_steps=10)
    new = _o(lr=2.0, lr_decay_style="linear", total_training_steps=20)
    full, extra_only = ["model", "optimizer", "extra"], ["model", "extra"]
    loads = {
        "keep": (new + _o(use_checkpoint_opt_param_scheduler=True), full),
        "keep_no_optim": (new + _o(use_checkpoint_opt_param_scheduler=True), extra_only),
        "rebuild": (new + _o(use_checkpoint_opt_param_scheduler=False), full),
        "rebuild_no_optim": (new + _o(use_checkpoint_opt_param_scheduler=False), extra_only),
    }
    got = run_distributed(resume, 1, model_path, str(tmp_path / "ckpt"), saved, 4, loads, 3, timeout=600)[0]
    assert got["keep"] == pytest.approx([0.6, 0.5, 0.4])
    assert got["keep_no_optim"] == pytest.approx([0.6, 0.5, 0.4])
    assert got["rebuild"] == pytest.approx([1.6, 1.5, 1.4])
    assert got["rebuild_no_optim"] == pytest.approx([1.6, 1.5, 1.4])


# ---------------------------------------------------------------- no model: config and rules


def _issues(*overrides: str) -> dict[str, str]:
    """The optimizer issues of CPU_SMALL + overrides (the data / model files are not built here)."""
    return {i.key: i.problem for i in collect_issues(load_config([*CPU_SMALL, *overrides])) if ".optim." in i.key}


def test_precision_aware_optimizer_refused_where_it_cannot_run():
    issues = _issues(*_o(use_precision_aware_optimizer=True))
    problem = issues[f"{O}.use_precision_aware_optimizer"]
    assert "trainer.device=cpu" in problem and "use_distributed_optimizer=false" in problem and "float32" in problem
    # the state dtypes act only with it: refused alone (megatron would assert deep in a worker)
    issues = _issues(*_o(main_grads_dtype="bf16", exp_avg_dtype="fp8", exp_avg_sq_dtype="fp16"))
    for name in ("main_grads_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
        assert "precision-aware" in issues[f"{O}.{name}"]
    assert not _issues()  # the yaml defaults pass


def test_grad_reduce_dtype_follows_main_grads_dtype():
    from megarl.workers.megatron.optim import grad_reduce_in_fp32

    node = lambda **v: OmegaConf.merge(load_config(CPU_SMALL).critic.optim, v)  # noqa: E731
    assert grad_reduce_in_fp32(node())
    assert grad_reduce_in_fp32(node(use_precision_aware_optimizer=True))
    assert not grad_reduce_in_fp32(node(use_precision_aware_optimizer=True, main_grads_dtype="bf16"))


def test_override_optimizer_config_names_checked():
    issues = _issues(*_ov(adam_epss=1e-6, bf16=True, main_params_dtype="x"))
    assert "not a Megatron OptimizerConfig field" in issues[f"{O}.override_optimizer_config.adam_epss"]
    assert f"{M}.dtype" in issues[f"{O}.override_optimizer_config.bf16"]  # megarl sets it from the model dtype
    assert "dtype" in issues[f"{O}.override_optimizer_config.main_params_dtype"]
    # adam_beta2 has a typed key: moved to optim.betas at load (verl applies overrides last)
    assert list(load_config([*CPU_SMALL, *_ov(adam_beta2=0.95)]).actor_rollout_ref.actor.optim.betas) == [0.9, 0.95]
    assert not _issues(*_ov(adam_eps=1e-6, main_params_dtype="fp32"))

    from megarl.workers.megatron.optim import optimizer_config

    node = load_config([*CPU_SMALL, *_ov(adam_epss=1.0)]).actor_rollout_ref.actor.optim
    with pytest.raises(ValueError, match=rf"{O}.override_optimizer_config.adam_epss: not a Megatron"):
        optimizer_config(node, use_distributed_optimizer=False, dtype=torch.float32, prefix=O)
    node = load_config([*CPU_SMALL, *_ov(main_params_dtype="fp32")]).actor_rollout_ref.actor.optim
    assert optimizer_config(node, use_distributed_optimizer=False, dtype=torch.float32, prefix=O).main_params_dtype == torch.float32


def test_schedule_rules():
    issues = _issues(*_o(lr=1e-3, min_lr=1e-2, lr_warmup_init=1e-2, lr_decay_style="WSD", lr_decay_steps=5,
                         lr_warmup_steps=5))
    assert "above the peak" in issues[f"{O}.min_lr"]
    assert "above the peak" in issues[f"{O}.lr_warmup_init"]
    assert "WSD" in issues[f"{O}.lr_wsd_decay_steps"]
    assert "does not fit" in issues[f"{O}.lr_warmup_steps"]


def test_schedule_length_needed_at_build():
    """total_training_steps is set by the trainer; without it only a constant lr is defined."""
    from megarl.workers.megatron.optim import schedule_steps

    node = lambda *o: load_config([*CPU_SMALL, *o]).actor_rollout_ref.actor.optim  # noqa: E731
    assert schedule_steps(node(), prefix=O) == (0, 1)
    with pytest.raises(ValueError, match=rf"{O}.lr_decay_style='cosine' needs the schedule length"):
        schedule_steps(node(*_o(lr_decay_style="cosine")), prefix=O)
    with pytest.raises(ValueError, match=rf"{O}.lr_warmup_steps_ratio=0.1 needs the schedule length"):
        schedule_steps(node(*_o(lr_warmup_steps_ratio=0.1)), prefix=O)
    assert schedule_steps(node(*_o(lr_decay_style="cosine", lr_decay_steps=7, lr_warmup_steps_ratio=0.3)), prefix=O) == (2, 7)
    with pytest.raises(ValueError, match=rf"{O}.lr_warmup_steps: 8 warmup steps do not fit in the 8-step"):
        schedule_steps(node(*_o(lr_warmup_steps=8, total_training_steps=8)), prefix=O)
