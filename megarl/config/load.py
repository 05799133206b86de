"""Compose the config (as `python -m megarl.main_ppo` does) and resolve it for workers."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from megarl.config.schema import MegaRLConfig
from megarl.config.walk import iter_schema_keys

# The repo's configs/megatron (megarl is installed editable from the repo).
CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "configs" / "megatron")
CONFIG_NAME = "ppo_megatron_trainer"


def load_config(overrides: Sequence[str] = (), config_name: str = CONFIG_NAME) -> DictConfig:
    """Hydra-compose `config_name` with command-line style `overrides` (`a.b=c`)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides))


def resolve_config(cfg: DictConfig) -> DictConfig:
    """A resolved copy: interpolations replaced by values and `~` expanded in path keys.

    Workers get sub-trees of this; nothing downstream needs to expand paths again.
    `trainer.logger` given as one string (`trainer.logger=console`) becomes a list.
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
