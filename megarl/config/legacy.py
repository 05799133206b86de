"""verl 0.9's migration of the legacy top-level reward keys into `reward.*`.

verl keeps `custom_reward_function.{path,name}`, `reward_model.{reward_manager,enable}` (and
more, see compat.py) at null; a non-null value is moved to its `reward.*` place before the run,
so pre-0.9 command lines keep working. Setting both places to different values is an error.
Added mappings move too: `+custom_reward_function.reward_kwargs.*` and (verl's DAPO scripts)
`+reward_model.reward_kwargs.*`, merged into `reward.custom_reward_function.reward_kwargs` /
`reward.reward_kwargs` (verl assigns the whole mapping; at megarl's empty default that is the same).
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf, open_dict

from megarl.config.errors import Issue

# legacy key -> reward.* key
MOVES: dict[str, str] = {
    "custom_reward_function.path": "reward.custom_reward_function.path",
    "custom_reward_function.name": "reward.custom_reward_function.name",
    "reward_model.reward_manager": "reward.reward_manager.name",
    "reward_model.enable": "reward.reward_model.enable",
}


def _raw(cfg: DictConfig, key: str):
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent)
    if node is None or leaf not in node:
        return None
    return OmegaConf.to_container(node, resolve=False)[leaf]


def migrate_legacy_reward_keys(cfg: DictConfig, user_keys: set[str] | None = None) -> list[Issue]:
    """Move non-null legacy reward keys of `cfg` to `reward.*` in place; issues for conflicts."""
    issues = []
    for old, new in MOVES.items():
        value = _raw(cfg, old)
        if value is None:
            continue
        current = _raw(cfg, new)
        if user_keys is not None and new in user_keys and current != value:
            issues.append(Issue(old, value, f"conflicts with {new}={current} (verl moves the legacy key there)",
                                f"set only {new}"))
            continue
        OmegaConf.update(cfg, new, value, merge=False)
        OmegaConf.update(cfg, old, None, merge=False)
    for section, target in (("custom_reward_function", "reward.custom_reward_function.reward_kwargs"),
                            ("reward_model", "reward.reward_kwargs")):
        legacy = cfg.get(section)
        if legacy is not None and "reward_kwargs" in legacy:  # e.g. `+reward_model.reward_kwargs.max_resp_len=8192`
            merged = {**OmegaConf.to_container(OmegaConf.select(cfg, target), resolve=False),
                      **OmegaConf.to_container(legacy.reward_kwargs, resolve=False)}
            OmegaConf.update(cfg, target, merged, merge=False)
            with open_dict(cfg):
                del legacy["reward_kwargs"]
    return issues
