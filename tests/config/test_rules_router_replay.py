"""verl's routing-replay keys: accepted and typed, refused where a pass would have no routes to replay or
a router option would bypass the replay (verl's own refusal of R2 with rollout routes included)."""

from __future__ import annotations

import pytest

from config_testing import issue_for, no_issues
from megarl.config import typed_config

MOE = {"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16}
A = "actor_rollout_ref.actor.megatron.router_replay.mode"
REF = "actor_rollout_ref.ref.megatron.router_replay.mode"
RECORD = "actor_rollout_ref.rollout.enable_rollout_routing_replay"
KL = {"actor_rollout_ref.actor.use_kl_loss": True}


def test_r3_with_rollout_routes_is_accepted_and_the_reference_follows(make):
    cfg = make({A: "R3", RECORD: True, **KL}, hf=MOE)
    no_issues(cfg)
    arr = typed_config(cfg).actor_rollout_ref
    assert arr.actor.megatron.router_replay.mode == "R3" and arr.ref.megatron.router_replay.mode == "R3"
    assert arr.rollout.enable_rollout_routing_replay is True


def test_reference_replay_can_be_turned_off_as_in_verl(make):
    cfg = make({A: "R3", RECORD: True, REF: "disabled", **KL}, hf=MOE)
    no_issues(cfg)
    assert typed_config(cfg).actor_rollout_ref.ref.megatron.router_replay.mode == "disabled"


def test_r2_is_accepted_without_rollout_routes(make):
    no_issues(make({A: "R2", **KL}, hf=MOE))


def test_r3_needs_the_rollout_to_record_routes(make):
    issue_for(make({A: "R3"}, hf=MOE), A, RECORD, "=true")


def test_r2_with_rollout_routes_is_refused_as_verl_does(make):
    issue_for(make({A: "R2", RECORD: True}, hf=MOE), RECORD, "R2", "verl refuses")


def test_r2_needs_the_old_log_prob_pass(make):
    issue_for(make({A: "R2", "algorithm.rollout_correction.bypass_mode": True}, hf=MOE), A, "bypass_mode")


def test_reference_r2_needs_an_actor_recording(make):
    issue_for(make({A: "disabled", REF: "R2", **KL}, hf=MOE), REF, "old-log-prob")


def test_reference_r3_without_rollout_routes(make):
    issue_for(make({REF: "R3", **KL}, hf=MOE), REF, RECORD)


def test_replay_needs_an_moe_model(make):
    issue_for(make({A: "R3", RECORD: True}), A, "no MoE experts")
    issue_for(make({RECORD: True}), RECORD, "no MoE experts")


@pytest.mark.parametrize("name, value, words", [
    ("moe_router_fusion", True, "fused router"),
    ("moe_expert_capacity_factor", 1.0, "token dropping"),
    ("moe_router_force_load_balancing", True, "random logits"),
    ("moe_router_load_balancing_type", "sinkhorn", "sinkhorn"),
])
def test_router_options_that_bypass_a_replay_are_refused(make, name, value, words):
    key = f"actor_rollout_ref.actor.megatron.override_transformer_config.{name}"
    issue_for(make({A: "R3", RECORD: True, key: value}, hf=MOE), key, words)
    no_issues(make({key: value}, hf=MOE))  # without replay the option is the user's


def test_critic_and_file_keys_stay_refused(make):
    issue_for(make({"critic.megatron.router_replay.mode": "R3"}, hf=MOE), "critic.megatron.router_replay.mode",
              "not supported")
