"""The entry point: clean exit 2 on a bad config, override-key check, resolved config."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from megarl.config import check_override_keys, resolve_config
from megarl.main_ppo import prepare

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run_main(*args: str, tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "MEGARL_DEMO_DIR": str(tmp_path / "demo"), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "megarl.main_ppo", "--config-name=ppo_megatron_trainer", *args,
         f"hydra.run.dir={tmp_path / 'hydra'}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )


def test_bad_type_exits_2_with_clean_message(tmp_path):
    proc = _run_main("trainer.total_training_steps=abc", tmp_path=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "trainer.total_training_steps" in proc.stderr and "'abc'" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


def test_unknown_override_key_exits_2_with_did_you_mean(tmp_path):
    proc = _run_main("trainer.total_training_step=3", tmp_path=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "did you mean trainer.total_training_steps" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


def test_override_key_check_skips_additions_and_hydra_keys():
    assert check_override_keys(["+foo.bar=1", "hydra.run.dir=x", "--config-name=y", "~trainer.logger", "trainer.nnodes=2"]) == []
    (issue,) = check_override_keys(["algorithm.adv_estimater=grpo"])
    assert issue.key == "algorithm.adv_estimater" and "algorithm.adv_estimator" in issue.fix


def test_prepare_returns_the_typed_config_resolved_with_expanded_paths(make, monkeypatch, tmp_path):
    from megarl.config import MegaRLConfig
    from megarl.config.read import to_dict

    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = make({"trainer.rollout_data_dir": "~/dumps"})
    monkeypatch.setattr("megarl.data.demo.ensure_demo_assets", lambda cfg: None)  # no demo assets here
    checked = []
    monkeypatch.setattr("megarl.main_ppo.preflight", checked.append)  # data files here are empty stand-ins
    out = prepare(cfg)
    assert isinstance(out, MegaRLConfig) and checked == [out]  # the preflight sees the run's typed config
    assert out.trainer.rollout_data_dir == str(tmp_path / "dumps")
    assert out.actor_rollout_ref.rollout.weight_sync.bucket_size_mb == out.actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes
    assert out.actor_rollout_ref.rollout.response_length == out.data.max_response_length
    assert "${" not in OmegaConf.to_yaml(to_dict(out))


def test_resolve_config_expands_lists_of_paths(make, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    out = resolve_config(make({"data.val_files": ["~/a.parquet", "~/b.parquet"]}))
    assert list(out.data.val_files) == [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]


def test_resolve_config_makes_logger_a_list(make):
    assert list(resolve_config(make({"trainer.logger": "console"})).trainer.logger) == ["console"]


def test_which_models_the_run_builds(make):
    from megarl.config import typed_config

    def typed(overrides=None):
        return typed_config(make(overrides))

    assert not typed().trains_critic() and not typed().runs_reference()
    assert typed({"algorithm.adv_estimator": "gae"}).trains_critic()
    assert typed({"critic.enable": True}).trains_critic()
    assert not typed({"algorithm.adv_estimator": "gae", "critic.enable": False}).trains_critic()
    assert typed({"actor_rollout_ref.actor.use_kl_loss": True}).runs_reference()
    assert typed({"algorithm.use_kl_in_reward": True}).runs_reference()


def test_override_key_check_allows_keys_inside_free_form_mappings():
    assert check_override_keys(["+actor_rollout_ref.model.override_config.num_hidden_layers=2"]) == []
    assert check_override_keys(["actor_rollout_ref.rollout.engine_kwargs.vllm.seed=2"]) != []  # new: needs '+'
    assert check_override_keys(["reward.custom_reward_function.reward_kwargs={}"]) == []  # in the yaml
    assert check_override_keys(["actor_rollout_ref.model.path.x=2"]) != []


def test_top_level_configs_are_the_package_configs():
    """configs/megatron/ at the top of the repo (the design card's place) is the package's
    megarl/configs/megatron, the copy a wheel ships: one file, not two that could drift."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    top = repo / "configs" / "megatron" / "ppo_megatron_trainer.yaml"
    assert top.is_file() and top.resolve() == (repo / "megarl" / "configs" / "megatron" / "ppo_megatron_trainer.yaml").resolve()


@pytest.mark.parametrize("override, key", [("actor_rollout_ref.rollout.n=0", "actor_rollout_ref.rollout.n"),
                                           ("actor_rollout_ref.rollout.n=two", "actor_rollout_ref.rollout.n")])
def test_a_bad_value_is_reported_at_the_key_given_not_at_the_keys_that_follow_it(override, key):
    """actor.rollout_n and critic.rollout_n interpolate rollout.n: the problem and its fix name rollout.n, once
    (issue 37 item 9)."""
    from megarl.config import ConfigError, load_config

    with pytest.raises(ConfigError) as info:
        prepare(load_config(["actor_rollout_ref.model.path=/placeholder", override]))
    text = str(info.value)
    assert "rollout_n" not in text, text
    assert [issue.key for issue in info.value.issues] == [key], text


NEEDS_PLUS = "actor_rollout_ref.actor.megatron.override_transformer_config.transformer_impl=local"


def test_a_new_key_without_plus_is_one_message_with_exit_2(tmp_path, capsys):
    """Hydra's own report (several lines, HYDRA_FULL_ERROR, exit code 1) never reaches the user: main_ppo and
    the plan CLI name the key and the '+' form (issue 37 item 9)."""
    from megarl.plan.__main__ import main as plan_main

    proc = _run_main(NEEDS_PLUS, tmp_path=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"write +{NEEDS_PLUS}" in proc.stderr and "HYDRA_FULL_ERROR" not in proc.stderr + proc.stdout, proc.stderr
    assert plan_main([NEEDS_PLUS]) == 2
    err = capsys.readouterr().err
    assert f"+{NEEDS_PLUS}" in err and "Traceback" not in err and len(err.strip().splitlines()) <= 3, err
