"""verl 0.9's migration of the legacy top-level reward keys into `reward.*`.

verl keeps `custom_reward_function.{path,name}`, `reward_model.{reward_manager,enable}` (and
more, see compat.py) at null; a non-null value is moved to its `reward.*` place before the run,
so pre-0.9 command lines keep working. Setting both places to different values is an error.
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
    legacy_fn = cfg.get("custom_reward_function")
    if legacy_fn is not None and "reward_kwargs" in legacy_fn:  # `+custom_reward_function.reward_kwargs.x=1`
        merged = {**OmegaConf.to_container(cfg.reward.custom_reward_function.reward_kwargs, resolve=False),
                  **OmegaConf.to_container(legacy_fn.reward_kwargs, resolve=False)}
        OmegaConf.update(cfg, "reward.custom_reward_function.reward_kwargs", merged, merge=False)
        with open_dict(cfg):
            del cfg.custom_reward_function["reward_kwargs"]
    return issues
