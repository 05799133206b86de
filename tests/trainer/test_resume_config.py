"""Resume compares the checkpoint's stored config with the current one: a model / optimizer
change that cannot apply is refused naming key, old and new value; every other change is
reported as applied or as kept from the checkpoint (optim.use_checkpoint_opt_param_scheduler)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from megarl.config import CONFIG_DIR, CONFIG_NAME, ConfigError, typed_config

CONFIG = Path(CONFIG_DIR) / f"{CONFIG_NAME}.yaml"
LR = "actor_rollout_ref.actor.optim.lr"


def _model(directory: Path, **changes) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    config = {"model_type": "qwen2", "hidden_size": 128, "num_hidden_layers": 2, "vocab_size": 64, **changes}
    (directory / "config.json").write_text(json.dumps(config))
    return str(directory)


def _cfg(model: str, *dotted: str):
    cfg = OmegaConf.load(CONFIG)
    cfg.actor_rollout_ref.model.path = model
    for item in dotted:
        key, value = item.split("=", 1)
        OmegaConf.update(cfg, key, yaml.safe_load(value), force_add=True)
    return typed_config(cfg)


def _check(saved_cfg, cfg, use_critic=False):
    from megarl.trainer.resume_config import check_resume_config, run_record

    record = json.loads(json.dumps(run_record(saved_cfg, use_critic)))  # as stored in run_config.json
    return check_resume_config(record, cfg, use_critic, "/ckpt/global_step_4")


def test_unchanged_config_reports_nothing(tmp_path):
    model = _model(tmp_path / "m")
    assert _check(_cfg(model), _cfg(model, "trainer.resume_mode=resume_path")) == []


def test_lr_change_is_applied_by_default_and_says_so(tmp_path):
    model = _model(tmp_path / "m")
    lines = _check(_cfg(model), _cfg(model, f"{LR}=1.0"))
    assert len(lines) == 1 and LR in lines[0] and "1e-06 -> 1.0" in lines[0] and "applied" in lines[0], lines
    assert "use_checkpoint_opt_param_scheduler=false" in lines[0]


def test_lr_change_is_kept_from_the_checkpoint_when_asked_and_says_so(tmp_path):
    model = _model(tmp_path / "m")
    flag = "actor_rollout_ref.actor.optim.use_checkpoint_opt_param_scheduler=true"
    lines = _check(_cfg(model, flag), _cfg(model, f"{LR}=1.0", flag))
    assert len(lines) == 1 and "1e-06 -> 1.0" in lines[0] and "not applied" in lines[0] and "checkpoint" in lines[0], lines


def test_other_changes_are_listed_as_applied(tmp_path):
    model = _model(tmp_path / "m")
    lines = _check(_cfg(model), _cfg(model, "actor_rollout_ref.actor.ppo_epochs=2", "actor_rollout_ref.actor.optim.betas=[0.8,0.9]"))
    assert any("actor_rollout_ref.actor.ppo_epochs: 1 -> 2" in line and "applied" in line for line in lines), lines
    assert any("optim.betas" in line and "applied" in line for line in lines), lines


def test_fixed_kl_coef_is_applied_adaptive_is_kept(tmp_path):
    model = _model(tmp_path / "m")
    lines = _check(_cfg(model), _cfg(model, "algorithm.kl_ctrl.kl_coef=0.5"))
    assert "applied" in lines[0], lines
    adaptive = "algorithm.kl_ctrl.type=adaptive"
    lines = _check(_cfg(model, adaptive), _cfg(model, adaptive, "algorithm.kl_ctrl.kl_coef=0.5"))
    assert "not applied" in lines[0] and "adaptive" in lines[0], lines


def test_other_model_path_is_refused_with_old_new_and_fix(tmp_path):
    old, new = _model(tmp_path / "old"), _model(tmp_path / "new")  # same shapes, other weights
    with pytest.raises(ConfigError) as info:
        _check(_cfg(old), _cfg(new))
    (issue,) = info.value.issues
    assert issue.key == "actor_rollout_ref.model.path" and issue.value == new
    assert old in issue.problem and "/ckpt/global_step_4" in issue.problem
    assert "trainer.resume_mode=disable" in issue.fix and old in issue.fix


def test_other_shapes_at_the_same_path_are_refused_naming_the_field(tmp_path):
    model = _model(tmp_path / "m")
    saved = _cfg(model)
    record_cfg = saved
    from megarl.trainer.resume_config import check_resume_config, run_record

    record = json.loads(json.dumps(run_record(record_cfg, False)))
    _model(tmp_path / "m", hidden_size=256)  # the directory now holds another model
    with pytest.raises(ConfigError) as info:
        check_resume_config(record, _cfg(model), False, "/ckpt/global_step_4")
    text = str(info.value)
    assert "hidden_size: 128 -> 256" in text and "actor_rollout_ref.model.path" in text


def test_optimizer_change_and_override_config_are_refused(tmp_path):
    model = _model(tmp_path / "m")
    with pytest.raises(ConfigError) as info:
        _check(_cfg(model), _cfg(model, "actor_rollout_ref.actor.optim.optimizer=sgd",
                                 "actor_rollout_ref.model.override_config.hidden_size=64"))
    keys = sorted(i.key for i in info.value.issues)
    assert keys == ["actor_rollout_ref.actor.optim.optimizer", "actor_rollout_ref.model.override_config"], keys


def test_critic_needed_but_not_in_the_checkpoint_is_refused(tmp_path):
    model = _model(tmp_path / "m")
    from megarl.trainer.resume_config import check_resume_config, run_record

    record = json.loads(json.dumps(run_record(_cfg(model), False)))
    with pytest.raises(ConfigError, match="critic"):
        check_resume_config(record, _cfg(model, "algorithm.adv_estimator=gae"), True, "/ckpt/global_step_4")


DIST = "actor_rollout_ref.actor.megatron.use_distributed_optimizer"
TP = "actor_rollout_ref.actor.megatron.tensor_model_parallel_size"
LOAD = "actor_rollout_ref.actor.checkpoint.load_contents"


@pytest.mark.parametrize("saved, now", [("false", "true"), ("true", "false")])
def test_another_distributed_optimizer_setting_is_refused_before_start(tmp_path, saved, now):
    """Issue 37 item 4: listed as applied, then refused by the workers after they started; decided here now."""
    model = _model(tmp_path / "m")
    with pytest.raises(ConfigError) as info:
        _check(_cfg(model, f"{DIST}={saved}"), _cfg(model, f"{DIST}={now}"))
    (issue,) = info.value.issues
    assert issue.key == DIST and f"it was {saved.capitalize()}" in issue.problem and "distributed optimizer" in issue.problem
    assert f"{DIST}={saved.capitalize()}" in issue.fix and LOAD in issue.fix
    lines = _check(_cfg(model, f"{DIST}={saved}"), _cfg(model, f"{DIST}={now}", f"{LOAD}=[model,extra]"))
    assert any(line.startswith(f"{DIST}:") and line.endswith(": applied") for line in lines), lines  # state not loaded


def test_a_dp_reshardable_state_at_another_layout_is_refused_a_fully_reshardable_one_applied(tmp_path):
    model = _model(tmp_path / "m")
    with pytest.raises(ConfigError) as info:
        _check(_cfg(model, f"{DIST}=true"), _cfg(model, f"{DIST}=true", f"{TP}=2"))
    (issue,) = info.value.issues
    assert issue.key == TP and "dp_reshardable" in issue.problem and "dist_ckpt_optim_fully_reshardable=true" in issue.fix
    full = "actor_rollout_ref.actor.megatron.dist_ckpt_optim_fully_reshardable=true"
    lines = _check(_cfg(model, f"{DIST}=true", full), _cfg(model, f"{DIST}=true", full, f"{TP}=2"))
    assert any(line.startswith(f"{TP}: 1 -> 2: applied") for line in lines), lines
    lines = _check(_cfg(model, f"{DIST}=false"), _cfg(model, f"{DIST}=false", f"{TP}=2"))  # torch's state: any layout
    assert any(line.startswith(f"{TP}: 1 -> 2: applied") for line in lines), lines
