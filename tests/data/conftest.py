"""Fixtures for the data tests: the demo tokenizer, the warmed-up demo model, a parquet writer and the data config."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from omegaconf import DictConfig, OmegaConf

from megarl.config.schema.data import DataConfig
from megarl.data.demo_tokenizer import build_demo_tokenizer


@functools.cache
def _yaml_config() -> DictConfig:
    from helpers.cpu_config import CPU_SMALL
    from megarl.config import load_config

    return load_config([*CPU_SMALL, "actor_rollout_ref.model.path=/placeholder/model"])


def data_config(**overrides: Any) -> DataConfig:
    """The yaml's typed `data` section (composed as a run would) with `overrides` set
    (`key=value`; nested sections as dicts, e.g. custom_cls={"path": ..., "name": ...})."""
    from megarl.config import typed_config

    cfg = copy.deepcopy(_yaml_config())
    for key, value in overrides.items():
        OmegaConf.update(cfg, f"data.{key}", value, merge=False)
    return typed_config(cfg).data


@pytest.fixture(scope="session")
def tokenizer():
    """Demo tokenizer: "<|user|>" + content + "<|assistant|>", every digit one token."""
    return build_demo_tokenizer()


@pytest.fixture(scope="session")
def warm_model(tokenizer):
    """The demo model after its warm-up (as in the demo dir), eval mode; copy it before training it."""
    from megarl.data.demo_model import build_demo_model
    from megarl.data.demo_warmup import warm_up

    model = build_demo_model(tokenizer)
    warm_up(model, tokenizer)
    return model


def chat(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def row(content: str, index: int, answer: str = "9") -> dict:
    return {
        "data_source": "src",
        "prompt": chat(content),
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"index": index},
    }


@pytest.fixture
def write_rows(tmp_path: Path):
    def write(rows: list[dict], name: str = "data.parquet") -> str:
        path = tmp_path / name
        pq.write_table(pa.Table.from_pylist(rows), str(path))
        return str(path)

    return write
