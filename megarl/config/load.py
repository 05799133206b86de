"""Compose the config (as `python -m megarl.main_ppo` does) and resolve it for workers."""

from __future__ import annotations

import os
from collections.abc import Sequence
from importlib.resources import files

from omegaconf import DictConfig, OmegaConf

from megarl.config.schema import MegaRLConfig
from megarl.config.walk import iter_schema_keys

# megarl/configs/megatron, shipped inside the package (package data of the wheel), so an editable
# install, `pip install .` and a wheel all find it. pip installs unpack to a directory, which
# Hydra needs: a zipped megarl would have no path to give it.
CONFIG_DIR = str(files("megarl") / "configs" / "megatron")
CONFIG_NAME = "ppo_megatron_trainer"


def finish_compose(cfg: DictConfig, overrides: Sequence[str]) -> dict[str, object]:
    """After Hydra composed `cfg` from `overrides`: move legacy reward keys to `reward.*` (verl's
    migration) and optimizer overrides that have a typed key to it (verl applies them last); when no model is given, apply the demo profile to the keys the user did not
    set. Mutates `cfg`; returns the demo-profile values applied (empty for a real run)."""
    from megarl.config.errors import ConfigError
    from megarl.config.legacy import migrate_legacy_reward_keys, move_optimizer_overrides
    from megarl.config.profile import apply_demo_profile, override_keys

    user_keys = override_keys(overrides)
    issues = migrate_legacy_reward_keys(cfg, user_keys) + move_optimizer_overrides(cfg, user_keys)
    if issues:
        raise ConfigError(issues)
    return apply_demo_profile(cfg, user_keys)


def load_config(overrides: Sequence[str] = (), config_name: str = CONFIG_NAME) -> DictConfig:
    """Compose `config_name` with command-line style `overrides` (`a.b=c`) exactly as
    `python -m megarl.main_ppo` does (Hydra, legacy-key migration, demo profile)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name=config_name, overrides=list(overrides))
    finish_compose(cfg, overrides)
    return cfg


def resolve_config(cfg: DictConfig) -> DictConfig:
    """A resolved copy: interpolations replaced by values and `~` expanded in path keys.

    Workers get sub-trees of this; nothing downstream needs to expand paths again.
    `trainer.logger` given as one string (`trainer.logger=console`) becomes a list.
    `rollout.weight_sync.bucket_size_mb` follows verl's `checkpoint_engine.update_weights_bucket_megabytes`
    unless set itself.
    """
    out = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    if isinstance(OmegaConf.select(out, "trainer.logger", default=None), str):
        OmegaConf.update(out, "trainer.logger", [out.trainer.logger])
    for key, _, meta in iter_schema_keys(MegaRLConfig):
        if not meta.get("path"):
            continue
        value = OmegaConf.select(out, key, default=None)
        if isinstance(value, str):
            OmegaConf.update(out, key, os.path.expanduser(value))
        elif value is not None and OmegaConf.is_list(value):
            OmegaConf.update(out, key, [os.path.expanduser(v) if isinstance(v, str) else v for v in value])
    return out
