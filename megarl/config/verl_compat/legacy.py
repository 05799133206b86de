"""verl 0.9's migration of the legacy top-level reward keys into `reward.*`.

verl keeps `custom_reward_function.{path,name}` and `reward_model.{reward_manager, enable,
enable_resource_pool, n_gpus_per_node, nnodes, num_workers, model.path, rollout.*}` at null; a
non-null value is moved to its `reward.*` place before the run, so pre-0.9 command lines keep working. Setting both places to different values is an error.
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
    "reward_model.enable_resource_pool": "reward.reward_model.enable_resource_pool",
    "reward_model.n_gpus_per_node": "reward.reward_model.n_gpus_per_node",
    "reward_model.nnodes": "reward.reward_model.nnodes",
    "reward_model.model.path": "reward.reward_model.model_path",
    "reward_model.num_workers": "reward.num_workers",
}
# verl moves every non-null `reward_model.rollout.<key>` to `reward.reward_model.rollout.<key>`
LEGACY_RM_ROLLOUT = ("reward_model.rollout", "reward.reward_model.rollout")


def _raw(cfg: DictConfig, key: str):
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent)
    if node is None or leaf not in node:
        return None
    return OmegaConf.to_container(node, resolve=False)[leaf]


def migrate_legacy_reward_keys(cfg: DictConfig, user_keys: set[str] | None = None) -> list[Issue]:
    """Move non-null legacy reward keys of `cfg` to `reward.*` in place; issues for conflicts."""
    issues = []
    legacy_rollout = OmegaConf.select(cfg, LEGACY_RM_ROLLOUT[0])
    rollout_moves = {f"{LEGACY_RM_ROLLOUT[0]}.{k}": f"{LEGACY_RM_ROLLOUT[1]}.{k}" for k in (legacy_rollout or {})}
    for old, new in {**MOVES, **rollout_moves}.items():
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


# verl applies `optim.override_optimizer_config` last, over its own keys: a field that has a typed
# optim key is moved there (so the one key holds the value the optimizer and the rules see).
OPTIMIZER_OVERRIDE_MOVES: dict[str, str] = {
    "optimizer": "optimizer", "lr": "lr", "min_lr": "min_lr", "weight_decay": "weight_decay", "clip_grad": "clip_grad",
    "use_precision_aware_optimizer": "use_precision_aware_optimizer", "main_grads_dtype": "main_grads_dtype",
    "exp_avg_dtype": "exp_avg_dtype", "exp_avg_sq_dtype": "exp_avg_sq_dtype",
}


def move_optimizer_overrides(cfg: DictConfig, user_keys: set[str]) -> list[Issue]:
    """Move `override_optimizer_config` fields that have a typed optim key (and adam_beta1/2 into
    optim.betas) to that key, in place, for the actor and critic; conflicts are issues."""
    issues = []
    for section in ("actor_rollout_ref.actor.optim", "critic.optim"):
        optim = OmegaConf.select(cfg, section)
        if optim is None or not optim.get("override_optimizer_config"):
            continue
        overrides = optim.override_optimizer_config
        for field in [f for f in list(overrides) if f in OPTIMIZER_OVERRIDE_MOVES or f in ("adam_beta1", "adam_beta2")]:
            value = overrides[field]
            if field in ("adam_beta1", "adam_beta2"):
                target, index = f"{section}.betas", int(field[-1]) - 1
                betas = list(optim.betas)
                betas[index] = value
                new = betas
            else:
                target, new = f"{section}.{OPTIMIZER_OVERRIDE_MOVES[field]}", value
            if target in user_keys and OmegaConf.select(cfg, target) != new:
                issues.append(Issue(f"{section}.override_optimizer_config.{field}", value,
                                    f"conflicts with {target}={OmegaConf.select(cfg, target)}", f"set only {target}"))
                continue
            OmegaConf.update(cfg, target, new, merge=False)
            with open_dict(overrides):
                del overrides[field]
    return issues
