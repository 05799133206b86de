"""Per-key checks: yaml <-> schema agreement, unknown keys, types, ranges, names."""

from __future__ import annotations

import re

import pytest
from omegaconf import OmegaConf

from megarl.config import CONFIG_DIR, CONFIG_NAME, ConfigError, check_schema, collect_issues, validate_config
from megarl.config.schema.root import MegaRLConfig
from megarl.config.schema.field import iter_schema_keys

from config_testing import issue_for, no_issues

YAML = f"{CONFIG_DIR}/{CONFIG_NAME}.yaml"


def test_every_typed_key_and_compat_section_has_a_comment():
    """A typed key has its own comment; a compat key has its own or its section's."""
    import re as _re

    typed = {key for key, _, _ in iter_schema_keys(MegaRLConfig)}
    stack: list[tuple[str, bool]] = []  # (key, commented)
    for n, line in enumerate(open(YAML), 1):
        m = _re.match(r"^( *)('?\w+'?):(.*)$", line.rstrip("\n"))
        if not m or line.lstrip().startswith("#"):
            continue
        depth = len(m.group(1)) // 2
        stack = stack[:depth] + [(m.group(2).strip("'"), "  # " in m.group(3))]
        key = ".".join(k for k, _ in stack)
        commented = any(c for _, c in stack) if key not in typed else stack[-1][1]
        if key in typed or (m.group(3).strip() and not m.group(3).strip().startswith("#")):
            assert commented, f"{YAML}:{n} has no comment: {line.rstrip()}"


def test_default_config_passes_schema(default_cfg):
    assert check_schema(default_cfg) == []


def test_default_config_validates_on_tiny_assets(make):
    no_issues(make())


def test_unknown_key_did_you_mean(make):
    issue = issue_for(make({"actor_rollout_ref.rollout.temprature": 0.7}), "actor_rollout_ref.rollout.temprature", "unknown key")
    assert "actor_rollout_ref.rollout.temperature" in issue.fix


def test_unknown_key_found_elsewhere_in_tree(make):
    issue = issue_for(make({"actor_rollout_ref.actor.n": 4}), "actor_rollout_ref.actor.n", "unknown key")
    assert "actor_rollout_ref.rollout.n" in issue.fix


def test_unknown_key_found_at_the_top_level_says_so(make):
    """verl's scripts pass actor.model_engine; the key is the top-level model_engine."""
    issue = issue_for(make({"actor_rollout_ref.actor.model_engine": "megatron"}), "actor_rollout_ref.actor.model_engine",
                      "unknown key")
    assert "the top-level model_engine" in issue.fix


def test_unknown_verl_key_says_not_supported(make):
    issue_for(make({"actor_rollout_ref.model.lora_rank": 8}), "actor_rollout_ref.model.lora_rank", "reads LoRA from model.lora")
    issue_for(make({"actor_rollout_ref.actor.fsdp_config": {"param_offload": True}}), "actor_rollout_ref.actor.fsdp_config", "FSDP")


def test_missing_key(make):
    cfg = make()
    del cfg.trainer["test_freq"]
    issue_for(cfg, "trainer.test_freq", "missing key")


def test_string_where_int_expected(make):
    issue_for(make({"trainer.total_training_steps": "abc"}), "trainer.total_training_steps", "expected integer", "'abc'", "=null (the default)")


def test_bool_and_float_are_not_ints(make):
    issue_for(make({"data.train_batch_size": True}), "data.train_batch_size", "expected integer")
    issue_for(make({"data.train_batch_size": 1.5}), "data.train_batch_size", "expected integer")


def test_int_accepted_where_float_expected(make):
    no_issues(make({"actor_rollout_ref.actor.optim.lr": 1}))


def test_range_lr(make):
    issue_for(make({"actor_rollout_ref.actor.optim.lr": 0.0}), "actor_rollout_ref.actor.optim.lr", "> 0")


@pytest.mark.parametrize("value", [0.0, 1.5, -0.1])
def test_gpu_memory_utilization_outside_0_1(make, value):
    issue_for(make({"actor_rollout_ref.rollout.gpu_memory_utilization": value}), "actor_rollout_ref.rollout.gpu_memory_utilization")


def test_gpu_memory_utilization_one_is_fine(make):
    no_issues(make({"actor_rollout_ref.rollout.gpu_memory_utilization": 1.0}))


@pytest.mark.parametrize(
    "key,value,valid_name",
    [
        ("algorithm.adv_estimator", "grpoo", "grpo"),
        ("actor_rollout_ref.actor.policy_loss.loss_mode", "vanila", "vanilla"),
        ("actor_rollout_ref.actor.loss_agg_mode", "token_mean", "token-mean"),
        ("algorithm.kl_penalty", "klx", "low_var_kl"),
        ("actor_rollout_ref.actor.kl_loss_type", "lowvar", "low_var_kl"),
        ("data.truncation", "cut", "left"),
        ("trainer.logger", ["console", "clearml"], "tensorboard"),
    ],
)
def test_unknown_names_list_the_valid_ones(make, key, value, valid_name):
    issue = issue_for(make({key: value}), key, "unknown name")
    assert valid_name in issue.fix


def test_registry_names_are_accepted(make):
    algorithms = pytest.importorskip("megarl.algorithms")
    for name in algorithms.ADV_ESTIMATORS:
        issues = [i for i in collect_issues(make({"algorithm.adv_estimator": name})) if i.key == "algorithm.adv_estimator"]
        assert not issues, name


@pytest.mark.parametrize(
    "key,value,words",
    [
        ("actor_rollout_ref.rollout.name", "sglang", "vLLM only"),
        ("actor_rollout_ref.actor.strategy", "fsdp", "Megatron-Core only"),
    ],
)
def test_unsupported_values(make, key, value, words):
    issue_for(make({key: value}), key, "not supported", words)


def test_rollout_mode_names(make):
    issue_for(make({"actor_rollout_ref.rollout.mode": "streaming"}), "actor_rollout_ref.rollout.mode", "unknown name", "async, sync")
    no_issues(make({"actor_rollout_ref.rollout.mode": "sync"}))


def test_broken_interpolation_names_key(make):
    issue_for(make({"actor_rollout_ref.actor.optim.clip_grad": "${actor_rollout_ref.actor.no_such_key}"}), "actor_rollout_ref.actor.optim.clip_grad", "cannot resolve")


def test_all_errors_reported_together(make):
    cfg = make({"trainer.total_training_steps": "abc", "actor_rollout_ref.actor.optim.lr": -1.0, "actor_rollout_ref.rollout.n": 1, "data.max_prompt_length": 0})
    with pytest.raises(ConfigError) as info:
        validate_config(cfg)
    assert isinstance(info.value, ValueError)
    text = str(info.value)
    for key in ("trainer.total_training_steps", "actor_rollout_ref.actor.optim.lr", "actor_rollout_ref.rollout.n", "data.max_prompt_length"):
        assert key in text
    assert len(info.value.issues) >= 4
