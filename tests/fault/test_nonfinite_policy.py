"""trainer.nan_policy decisions (megarl.utils.nonfinite, workers' NonFiniteCheck) as pure functions."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from megarl.utils.nonfinite import NonFiniteError, check_update, nonfinite_values

ARGS = dict(role="critic", phase="update_critic", global_step=12, mini_batch=2, num_mini_batches=4)


def test_nonfinite_values_picks_nan_and_both_infinities():
    got = nonfinite_values({"a": 1.0, "b": math.nan, "c": math.inf, "d": -math.inf, "e": 3, "f": "text"})
    assert set(got) == {"b", "c", "d"}


def test_finite_step_is_kept_under_both_policies():
    for policy in ("stop", "skip"):
        assert check_update({"critic/vf_loss": 0.5, "critic/grad_norm": 2.0}, policy=policy, **ARGS) is False


def test_stop_names_step_phase_mini_batch_and_values():
    with pytest.raises(NonFiniteError) as info:
        check_update({"critic/vf_loss": math.inf, "critic/grad_norm": math.nan}, policy="stop", **ARGS)
    message = str(info.value)
    for part in ("critic:", "global step 12", "phase update_critic", "mini-batch 3 of 4", "critic/grad_norm=nan",
                 "critic/vf_loss=inf", "trainer.nan_policy=skip"):
        assert part in message, part


def test_skip_drops_and_unknown_policy_is_refused():
    assert check_update({"critic/grad_norm": math.inf}, policy="skip", **ARGS) is True
    with pytest.raises(ValueError, match="trainer.nan_policy='ignore'"):
        check_update({"critic/grad_norm": 1.0}, policy="ignore", **ARGS)


def test_worker_check_counts_skips_and_treats_fp16_overflow_as_a_normal_skip():
    from megarl.workers.megatron.ppo_loop import NonFiniteCheck

    check = NonFiniteCheck({"nan_policy": "stop", "global_step": 3}, "actor_rollout_ref.actor", "update_actor", 3)
    assert not check.drop({"actor/pg_loss": 0.1, "actor/grad_norm": 1.0})
    assert check.metrics("actor") == {}
    # fp16: the loss scaler found inf grads and skipped (megatron's normal back-off), loss finite
    overflow = SimpleNamespace(megarl_last_step={"norm": math.nan, "scaler_overflow": True})
    assert check.drop({"actor/pg_loss": 0.1, "actor/grad_norm": math.nan}, overflow)
    assert check.metrics("actor") == {"actor/nonfinite_skipped_steps": 1.0}
    # but a NaN loss still stops, naming the third mini-batch
    with pytest.raises(NonFiniteError, match="global step 3, phase update_actor .mini-batch 3 of 3.: actor/pg_loss=nan"):
        check.drop({"actor/pg_loss": math.nan, "actor/grad_norm": math.nan}, overflow)


def test_worker_check_needs_the_trainers_nan_policy():
    """One source for the policy (trainer.nan_policy, sent in meta_info): no second default in the worker."""
    from megarl.workers.megatron.ppo_loop import NonFiniteCheck

    with pytest.raises(KeyError, match="trainer.nan_policy"):
        NonFiniteCheck({}, "critic", "update_critic", 1)
    with pytest.raises(NonFiniteError, match="global step \\?"):
        NonFiniteCheck({"nan_policy": "stop"}, "critic", "update_critic", 1).drop({"critic/grad_norm": math.inf})


def test_config_refuses_an_unknown_nan_policy():
    from megarl.config import check_schema
    from megarl.config.compose import load_config

    issues = check_schema(load_config(["trainer.nan_policy=ignore"]))
    assert any(i.key == "trainer.nan_policy" for i in issues), issues
    assert not [i for i in check_schema(load_config(["trainer.nan_policy=skip"])) if i.key == "trainer.nan_policy"]
