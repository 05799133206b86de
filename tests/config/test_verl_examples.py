"""Keys verl's Megatron example scripts need, each checked on its own: the engine choice, verl's
legacy reward keys, an uneven pipeline split (the scripts themselves are planned as they ship in
test_verl_scripts.py)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from config_testing import issue_for, no_issues
from megarl.config import collect_issues, load_config


# ------------------------------------------------------------------ what the scripts needed
def test_model_engine_megatron_is_accepted_and_others_are_refused(make):
    no_issues(make({"model_engine": "megatron"}))
    issue_for(make({"model_engine": "dp"}), "model_engine", "Megatron-Core only")


def test_reward_model_reward_kwargs_move_to_reward_reward_kwargs():
    """verl's migrate_legacy_reward_impl: reward_model.reward_kwargs -> reward.reward_kwargs (DAPO scripts)."""
    cfg = load_config(["actor_rollout_ref.model.path=/placeholder", "reward_model.reward_manager=dapo",
                       "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
                       "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4096", "+reward_model.reward_kwargs.max_resp_len=8192"])
    assert OmegaConf.to_container(cfg.reward.reward_kwargs) == {"overlong_buffer_cfg": {"enable": True, "len": 4096}, "max_resp_len": 8192}
    assert "reward_kwargs" not in cfg.reward_model and cfg.reward.reward_manager.name == "dapo"


@pytest.mark.parametrize("split, ok", [
    ({"num_layers_in_first_pipeline_stage": 11, "num_layers_in_last_pipeline_stage": 11}, True),  # 11 + 6 x 12 + 11 = 94
    ({"num_layers_in_first_pipeline_stage": 10, "num_layers_in_last_pipeline_stage": 11}, False),  # 73 middle layers over 6
    ({"pipeline_model_parallel_layout": "Et*12|t*12|t*12|t*12|t*12|t*12|t*12|t*10L"}, True),  # 94 layers in 8 stages
    ({"pipeline_model_parallel_layout": "Et*12|t*12|t*12|t*12|t*12|t*12|t*12|t*12L"}, False),  # 96 layers
])
def test_an_uneven_pipeline_split_is_judged_by_megatron(make, split, ok):
    """pp=8 does not divide 94 layers; Megatron-Core takes an explicit uneven split (verl's Qwen3-235B script)."""
    key = "actor_rollout_ref.actor.megatron"
    overrides = {f"{key}.pipeline_model_parallel_size": 8, "trainer.n_gpus_per_node": 8,
                 "actor_rollout_ref.actor.megatron.sequence_parallel": False,
                 **{f"{key}.override_transformer_config.{k}": v for k, v in split.items()}}
    cfg = make(overrides, hf={"num_hidden_layers": 94})
    keys = [i.key for i in collect_issues(cfg)]
    assert (f"{key}.override_transformer_config" not in keys and f"{key}.pipeline_model_parallel_size" not in keys) is ok, keys
    if not ok:
        issue_for(cfg, f"{key}.override_transformer_config", "Megatron-Core refuses this pipeline split")
    issue_for(make({f"{key}.pipeline_model_parallel_size": 8, "trainer.n_gpus_per_node": 8}, hf={"num_hidden_layers": 94}),
              f"{key}.pipeline_model_parallel_size", "does not divide num_hidden_layers=94", "num_layers_in_first_pipeline_stage")
