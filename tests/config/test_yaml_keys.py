"""No dead config keys: every yaml key is read by megarl, or refused when changed; yaml
comments list every registered name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from config_testing import issue_for, no_issues
from megarl.config.load import CONFIG_DIR, CONFIG_NAME
from megarl.config.rules_inert import INERT_KEYS

REPO = Path(__file__).resolve().parents[2]
YAML = Path(CONFIG_DIR) / f"{CONFIG_NAME}.yaml"
FREE_FORM = ("override_config", "vllm", "reward_kwargs", "override_transformer_config")
# Read only through an interpolation (grad_clip -> optim.clip_grad) or fixed by a Literal type.
NOT_READ_DIRECTLY = {
    "actor_rollout_ref.hybrid_engine": "Literal[True]",
    "actor_rollout_ref.actor.strategy": "Literal['megatron']",
    "actor_rollout_ref.rollout.mode": "Literal['sync']",
    "actor_rollout_ref.actor.grad_clip": "via optim.clip_grad: ${..grad_clip}",
    "critic.grad_clip": "via optim.clip_grad: ${..grad_clip}",
}


def yaml_leaf_keys() -> list[str]:
    cfg = OmegaConf.load(YAML)

    def walk(node, prefix=""):
        for k in node.keys():
            child = node._get_node(k)
            if OmegaConf.is_dict(child) and k not in FREE_FORM:
                yield from walk(child, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}"

    return list(walk(cfg))


def _sources() -> str:
    return "\n".join(p.read_text() for p in (REPO / "megarl").rglob("*.py") if "megarl/config" not in p.as_posix())


def _covered_by_inert(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in INERT_KEYS)


def test_every_yaml_key_is_read_or_refused():
    sources = _sources()
    unread = []
    for key in yaml_leaf_keys():
        last = key.rsplit(".", 1)[-1]
        if _covered_by_inert(key) or key in NOT_READ_DIRECTLY:
            continue
        if not re.search(rf"""(["']{re.escape(last)}["']|\.{re.escape(last)}\b)""", sources):
            unread.append(key)
    assert not unread, f"yaml keys no megarl code reads (implement, or add to megarl/config/rules_inert.py): {unread}"


@pytest.mark.parametrize("key, value", [
    ("data.return_raw_input_ids", True),
    ("actor_rollout_ref.rollout.multi_turn.max_user_turns", 3),
    ("reward_model.micro_batch_size_per_gpu", 4),
    ("reward_model.megatron.tensor_model_parallel_size", 2),
    ("reward_model.model.input_tokenizer", "/some/dir"),
])
def test_changed_inert_key_is_refused(make, key, value):
    parent = next(k for k in INERT_KEYS if key == k or key.startswith(k + "."))
    issue_for(make({key: value}), parent, "has no effect", "remove the override")


def test_inert_keys_at_default_are_fine(make, tmp_path):
    no_issues(make())
    no_issues(make({"actor_rollout_ref.model.path": str(tmp_path / "model")}))  # input_tokenizer's interpolation follows


@pytest.mark.parametrize("key, registry", [
    ("actor_rollout_ref.actor.policy_loss.loss_mode", "POLICY_LOSSES"),
    ("algorithm.adv_estimator", "ADV_ESTIMATORS"),
    ("actor_rollout_ref.actor.loss_agg_mode", "LOSS_AGG_MODES"),
])
def test_yaml_comment_lists_every_registered_name(key, registry):
    import megarl.algorithms as algorithms

    leaf = key.rsplit(".", 1)[-1]
    line = next(line for line in YAML.read_text().splitlines() if line.strip().startswith(f"{leaf}:"))
    listed = {n.strip() for n in line.split("#", 1)[1].split(":", 1)[1].split("(")[0].split("|")}
    missing = set(getattr(algorithms, registry)) - listed
    assert not missing, f"the yaml comment of {key} does not list {sorted(missing)}"
