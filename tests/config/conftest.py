"""Fixtures: the composed default config pointed at a tiny model dir and data files in tmp."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig, OmegaConf

from config_testing import write_model
from megarl.config import load_config


@pytest.fixture(scope="session")
def default_cfg() -> DictConfig:
    from helpers.cpu_config import CPU_SMALL

    return load_config([*CPU_SMALL, "actor_rollout_ref.model.path=/placeholder/model"])


@pytest.fixture
def make(default_cfg: DictConfig, tmp_path: Path):
    """make(overrides={dotted key: value}, hf={config.json fields}) -> a config on tmp assets."""
    write_model(tmp_path / "model")
    for name in ("train.parquet", "val.parquet"):
        (tmp_path / name).write_bytes(b"")

    def _make(overrides: dict[str, Any] | None = None, hf: dict[str, Any] | None = None) -> DictConfig:
        if hf is not None:
            write_model(tmp_path / "model", **hf)
        cfg = copy.deepcopy(default_cfg)
        OmegaConf.set_struct(cfg, False)
        OmegaConf.update(cfg, "actor_rollout_ref.model.path", str(tmp_path / "model"))
        OmegaConf.update(cfg, "data.train_files", str(tmp_path / "train.parquet"))
        OmegaConf.update(cfg, "data.val_files", str(tmp_path / "val.parquet"))
        # The rule tests derive their expected numbers from these sizes: pin them so that
        # tuning the demo's defaults in the yaml does not change what the tests assume.
        pinned = {
            "data.max_prompt_length": 32, "data.max_response_length": 8, "data.train_batch_size": 16,
            "actor_rollout_ref.rollout.n": 8, "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 16,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 32,
        }
        for key, value in pinned.items():
            OmegaConf.update(cfg, key, value)
        for key, value in (overrides or {}).items():
            OmegaConf.update(cfg, key, value, force_add=True)
        return cfg

    return _make
