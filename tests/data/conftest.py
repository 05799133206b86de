"""Fixtures for the data tests: the demo tokenizer, the warmed-up demo model, a parquet writer."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from megarl.data.demo_tokenizer import build_demo_tokenizer


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
