"""Schema of `data`: dataset files, prompt columns, lengths, batch size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from megarl.config.names import TRUNCATIONS
from megarl.config.schema.field import Section, spec


@dataclass
class ClassRef(Section):
    """A class loaded from a python file (`data.custom_cls`)."""

    path: str | None = spec(path=True)
    name: str | None = spec()


@dataclass
class SamplerRef(Section):
    """A sampler class loaded from a python file (`data.sampler`)."""

    class_path: str | None = spec(path=True)
    class_name: str | None = spec()


@dataclass
class DataConfig(Section):
    tokenizer: str | None = spec(path=True)
    train_files: str | list[str] = spec(path=True)
    val_files: str | list[str] = spec(path=True)
    train_max_samples: int = spec(ge=-1)
    val_max_samples: int = spec(ge=-1)
    prompt_key: str = spec()
    reward_fn_key: str = spec()
    max_prompt_length: int = spec(ge=1)
    max_response_length: int = spec(ge=1)
    train_batch_size: int = spec(ge=1)
    val_batch_size: int | None = spec(ge=1)
    return_raw_chat: bool = spec()
    return_full_prompt: bool = spec()
    shuffle: bool = spec()
    seed: int | None = spec(ge=0)
    validation_shuffle: bool = spec()
    filter_overlong_prompts: bool = spec()
    truncation: str = spec(choices=TRUNCATIONS)
    trust_remote_code: bool = spec()
    apply_chat_template_kwargs: dict[str, Any] = spec()
    custom_cls: ClassRef = spec()
    sampler: SamplerRef = spec()
