"""No dead config keys: every yaml key is typed (megarl implements it) or covered by exactly one
compat rule; a changed `refuse` key is an error naming it; yaml comments list every registered name."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from config_testing import issue_for, no_issues
from megarl.config.verl_compat.accepted_keys import RULES, rule_for
from megarl.config.files import CONFIG_DIR, CONFIG_NAME
from megarl.config.verl_compat.check import compat_notices
from megarl.config.schema.root import MegaRLConfig
from megarl.config.schema.field import iter_schema_keys

YAML = Path(CONFIG_DIR) / f"{CONFIG_NAME}.yaml"
FREE_FORM = {key for key, tp, _ in iter_schema_keys(MegaRLConfig) if tp is dict or getattr(tp, "__origin__", None) is dict}


def yaml_leaf_keys() -> list[str]:
    def walk(node, prefix=""):
        for k in node.keys():
            key = f"{prefix}{k}"
            child = node._get_node(k)
            if OmegaConf.is_dict(child) and len(child) and key not in FREE_FORM:
                yield from walk(child, f"{key}.")
            else:
                yield key

    return list(walk(OmegaConf.load(YAML)))


def test_every_yaml_key_is_typed_or_compat_and_never_both():
    typed = {key for key, _, _ in iter_schema_keys(MegaRLConfig)}
    leaves = yaml_leaf_keys()
    neither = [k for k in leaves if k not in typed and rule_for(k) is None]
    both = [k for k in leaves if k in typed and rule_for(k) is not None]
    assert not neither, f"yaml keys neither typed (megarl/config/schema/) nor in verl_compat/accepted_keys.py: {neither}"
    assert not both, f"typed keys also matched by a compat rule (remove the rule): {both}"
    missing = sorted(typed - set(leaves))
    assert not missing, f"schema keys with no yaml default: {missing}"


def test_every_compat_rule_matches_a_yaml_key():
    leaves = yaml_leaf_keys()
    unused = [r.pattern for r in RULES if not any(r.matches(k) for k in leaves)]
    assert not unused, f"compat rules that match no yaml key (dead rules): {unused}"


@pytest.mark.parametrize("key, value", [
    ("actor_rollout_ref.model.lora_rank", 8),
    ("actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode", "disable"),
    ("actor_rollout_ref.rollout.agent.custom_async_server.path", "server.py"),
    ("global_profiler.tool", "nsys"),
    ("critic.megatron.router_replay.mode", "R2"),
    ("actor_rollout_ref.actor.megatron.router_replay.record_file", "routes.pt"),
    ("data.return_raw_input_ids", True),
    ("reward.reward_model.rollout.name", "sglang"),
    ("reward.reward_model.enable_resource_pool", True),
    ("actor_rollout_ref.rollout.pipeline_model_parallel_size", 2),
])
def test_changed_refuse_key_is_refused_naming_it(make, key, value):
    issue_for(make({key: value}), key, "not supported", "remove the override")


def test_changed_ignore_key_is_accepted_and_noted_once(make):
    cfg = make({"actor_rollout_ref.actor.use_torch_compile": False, "data.dataloader_num_workers": 2})
    no_issues(cfg)
    notes = compat_notices(cfg)
    assert len(notes) == 2 and any(n.startswith("actor_rollout_ref.actor.use_torch_compile=False has no effect") for n in notes)


MBRIDGE = "actor_rollout_ref.{}.megatron.use_mbridge"


@pytest.mark.parametrize("actor, ref, noted", [
    (None, True, []),  # verl's scripts: the ref's value mirrors the actor's default
    (False, False, ["actor"]),  # once, for the actor; the ref follows it
    (None, False, ["ref"]),  # the ref differs from the actor
    (False, True, ["actor", "ref"]),
])
def test_use_mbridge_is_noted_once_and_only_where_the_ref_differs_from_the_actor(make, actor, ref, noted):
    overrides = {MBRIDGE.format("ref"): ref, **({} if actor is None else {MBRIDGE.format("actor"): actor})}
    notes = compat_notices(make(overrides))
    assert [n.split("=", 1)[0] for n in notes] == [MBRIDGE.format(role) for role in noted], notes


def test_compat_keys_at_default_are_fine_and_silent(make):
    cfg = make()
    no_issues(cfg)
    assert compat_notices(cfg) == []


@pytest.mark.parametrize("key, registry", [
    ("actor_rollout_ref.actor.policy_loss.loss_mode", "POLICY_LOSSES"),
    ("algorithm.adv_estimator", "ADV_ESTIMATORS"),
    ("actor_rollout_ref.actor.loss_agg_mode", "LOSS_AGG_MODES"),
])
def test_yaml_comment_lists_every_registered_name(key, registry):
    from megarl.config import names

    leaf = key.rsplit(".", 1)[-1]
    line = next(line for line in YAML.read_text().splitlines() if line.strip().startswith(f"{leaf}:"))
    listed = {n.strip() for n in line.split("#", 1)[1].split(":", 1)[1].split("(")[0].split("|")}
    missing = set(getattr(names, registry)) - listed
    assert not missing, f"the yaml comment of {key} does not list {sorted(missing)}"
