"""Assertion helpers for the config tests (imported as a top-level module)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from megarl.config import collect_issues
from megarl.preflight import RUNTIME_RULES


def issue_for(cfg: DictConfig, key: str, *words: str):
    """The issue reported for `key` (as main_ppo validates: with the runtime's rules); its text must
    contain each of `words`."""
    issues = collect_issues(cfg, RUNTIME_RULES)
    found = [i for i in issues if i.key == key]
    listing = "\n".join(i.format() for i in issues)
    assert found, f"no issue for {key}; got:\n{listing}"
    text = "\n".join(i.format() for i in found)
    for word in words:
        assert word in text, f"{word!r} not in:\n{text}"
    return found[0]


def no_issues(cfg: DictConfig) -> None:
    issues = collect_issues(cfg, RUNTIME_RULES)
    assert not issues, "\n".join(i.format() for i in issues)


TINY_HF = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 4,
    "max_position_embeddings": 128,
    "vocab_size": 256,
}


def write_model(model_dir: Path, **fields: Any) -> Path:
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps({**TINY_HF, **fields}))
    (model_dir / "model.safetensors").touch()  # only its presence is checked before workers start
    return model_dir
