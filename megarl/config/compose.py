"""Compose the config as `python -m megarl.main_ppo` does: Hydra, then verl's migrations and the
demo profile."""

from __future__ import annotations

from collections.abc import Sequence

from omegaconf import DictConfig

from megarl.compat.omegaconf_yaml import apply_c_yaml_loader
from megarl.config.demo_profile import apply_demo_profile, override_keys
from megarl.config.errors import ConfigError
from megarl.config.files import CONFIG_DIR, CONFIG_NAME
from megarl.config.verl_compat.legacy import migrate_legacy_reward_keys, move_optimizer_overrides


def finish_compose(cfg: DictConfig, overrides: Sequence[str]) -> dict[str, object]:
    """After Hydra composed `cfg` from `overrides`: move legacy reward keys to `reward.*` (verl's
    migration) and optimizer overrides that have a typed key to it (verl applies them last); when no
    model is given, apply the demo profile to the keys the user did not set. Mutates `cfg`; returns
    the demo-profile values applied (empty for a real run)."""
    user_keys = override_keys(overrides)
    issues = migrate_legacy_reward_keys(cfg, user_keys) + move_optimizer_overrides(cfg, user_keys)
    if issues:
        raise ConfigError(issues)
    return apply_demo_profile(cfg, user_keys)


def load_config(overrides: Sequence[str] = (), config_name: str = CONFIG_NAME) -> DictConfig:
    """Compose `config_name` with command-line style `overrides` (`a.b=c`) exactly as
    `python -m megarl.main_ppo` does (Hydra, legacy-key migration, demo profile)."""
    from hydra import compose, initialize_config_dir

    apply_c_yaml_loader()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name=config_name, overrides=list(overrides))
    finish_compose(cfg, overrides)
    return cfg
