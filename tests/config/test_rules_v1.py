"""trainer.v1 (verl's V1 trainer modes): verl's keys at verl's defaults; each value megarl cannot
honour is refused by key, with the fix, before anything starts."""

from __future__ import annotations

import pytest

from config_testing import issue_for, no_issues
from megarl.config import typed_config

V1 = "trainer.v1"
R = "actor_rollout_ref.rollout"
SEPARATE = {f"{V1}.trainer_mode": "separate_async", "actor_rollout_ref.hybrid_engine": False, f"{R}.nnodes": 1,
            f"{R}.n_gpus_per_node": 1, f"{R}.checkpoint_engine.backend": "nccl",
            f"{V1}.separate_async.parameter_sync_step": 2}  # the pinned batch: 16 prompts, mini-batches of 8


def test_verls_defaults_are_accepted_and_mean_sync(make):
    cfg = make()
    no_issues(cfg)
    assert typed_config(cfg).trainer.trainer_mode() == "sync"


@pytest.mark.parametrize("overrides", [
    {f"{V1}.trainer_mode": "colocate_async"},  # verl's defaults: threshold 8, one warm-up batch, drop
    {f"{V1}.trainer_mode": "colocate_async", f"{V1}.sampler.max_off_policy_threshold": 1,
     f"{V1}.colocate_async.num_warmup_batches": 0},
    {f"{V1}.trainer_mode": "colocate_async", f"{V1}.sampler.max_off_policy_threshold": None,
     f"{V1}.colocate_async.num_warmup_batches": 2.5, f"{V1}.sampler.max_off_policy_strategy": "wait"},
    SEPARATE,
])
def test_async_modes_are_accepted(make, overrides):
    no_issues(make(overrides))


def test_use_v1_false_is_verls_legacy_trainer(make):
    assert typed_config(make({"trainer.use_v1": False, f"{V1}.trainer_mode": "colocate_async"})).trainer.trainer_mode() == "sync"


@pytest.mark.parametrize("mode", ["colocate_async", "separate_async"])
def test_warmup_beyond_the_threshold_is_refused_with_the_fix(make, mode):
    base = SEPARATE if mode == "separate_async" else {f"{V1}.trainer_mode": mode}
    key = f"{V1}.{mode}.num_warmup_batches"
    issue_for(make({**base, f"{V1}.sampler.max_off_policy_threshold": 1}), key, "max_off_policy_threshold=1",
              f"{key} <= 0", "max_off_policy_threshold >= 2")
    issue_for(make({**base, f"{V1}.sampler.max_off_policy_threshold": 3, key: 2.5}), key, f"{key} <= 2")
    no_issues(make({**base, f"{V1}.sampler.max_off_policy_threshold": 3, key: 2}))


def test_warmup_of_the_other_mode_is_not_read(make):
    no_issues(make({f"{V1}.trainer_mode": "colocate_async", f"{V1}.sampler.max_off_policy_threshold": 1,
                    f"{V1}.colocate_async.num_warmup_batches": 0, f"{V1}.separate_async.num_warmup_batches": 5}))


@pytest.mark.parametrize("key, value, words", [
    (f"{R}.mode", "sync", "partial rollout"),
    ("algorithm.filter_groups.enable", True, "not implemented"),
    ("algorithm.adv_estimator", "remax", "greedy baseline"),
    ("reward.launch_reward_fn_async", True, "scored on the controller"),
    (f"{R}.enable_rollout_routing_replay", True, "does not carry the routes"),
])
@pytest.mark.parametrize("mode", ["colocate_async", "separate_async"])
def test_async_modes_refuse_what_they_do_not_implement(make, key, value, words, mode):
    base = SEPARATE if mode == "separate_async" else {f"{V1}.trainer_mode": mode}
    issue_for(make({**base, key: value}), key, words, "trainer_mode=sync" if key != f"{R}.mode" else f"{R}.mode=async")


@pytest.mark.parametrize("key, value, words", [
    (f"{R}.nnodes", 0, "nnodes > 0"),
    ("actor_rollout_ref.hybrid_engine", True, "hybrid_engine=false"),
    (f"{R}.checkpoint_engine.backend", "naive", "backend=nccl"),
    (f"{R}.tensor_model_parallel_size", 2, "tensor_model_parallel_size=1"),
    ("reward.reward_model.enable", True, "enable_resource_pool"),
    (f"{V1}.separate_async.parameter_sync_step", 4, "parameter_sync_step=2"),
])
def test_separate_async_placement_rules(make, key, value, words):
    issue_for(make({**SEPARATE, key: value}), key, words)


@pytest.mark.parametrize("key, value, words", [
    (f"{R}.nnodes", 1, "only with trainer.v1.trainer_mode=separate_async"),
    ("actor_rollout_ref.hybrid_engine", False, "hybrid engine"),
])
@pytest.mark.parametrize("mode", ["sync", "colocate_async"])
def test_standalone_pool_only_with_separate_async(make, key, value, words, mode):
    issue_for(make({f"{V1}.trainer_mode": mode, key: value}), key, words)


@pytest.mark.parametrize("key, value", [
    (f"{V1}.separate_async.hybrid_rollout.enable_switch", True),
    (f"{V1}.sampler.custom_sampler.path", "my_sampler.py"),
    (f"{V1}.sampler.sampler_kwargs.a", 1),
    (f"{V1}.sync.a", 1),
    (f"{V1}.sampler.sync_refill_failed_groups", True),
    (f"{R}.checkpoint_engine.backend", "nixl"),
])
def test_v1_values_megarl_cannot_honour_are_refused_by_key(make, key, value):
    issue_for(make({**SEPARATE, key: value}), key, "not supported", "remove the override")


def test_unknown_mode_and_strategy_names(make):
    issue_for(make({f"{V1}.trainer_mode": "fully_async"}), f"{V1}.trainer_mode", "unknown name", "separate_async")
    issue_for(make({f"{V1}.sampler.max_off_policy_strategy": "skip"}), f"{V1}.sampler.max_off_policy_strategy",
              "unknown name", "wait")
    issue_for(make({f"{V1}.sampler.max_off_policy_threshold": 0}), f"{V1}.sampler.max_off_policy_threshold")
