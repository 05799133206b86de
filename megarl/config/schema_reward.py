"""Schema of `reward`, `reward_model` and `custom_reward_function`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from megarl.config.names import REWARD_MANAGERS
from megarl.config.schema_megatron import MegatronInferConfig
from megarl.config.spec import spec


@dataclass
class OverlongBufferConfig:
    enable: bool = spec()
    len: int = spec(ge=1)
    penalty_factor: float = spec(ge=0)


@dataclass
class RewardModelModelConfig:
    path: str | None = spec(path=True)
    input_tokenizer: str | None = spec(path=True)
    trust_remote_code: bool = spec()


@dataclass
class RewardModelConfig:
    enable: bool = spec()
    reward_manager: str = spec(choices=REWARD_MANAGERS)
    launch_reward_fn_async: bool = spec()
    overlong_buffer: OverlongBufferConfig = spec()
    model: RewardModelModelConfig = spec()
    megatron: MegatronInferConfig = spec()
    micro_batch_size_per_gpu: int = spec(ge=1)
    max_length: int | None = spec(ge=1)


@dataclass
class RewardConfig:
    timeout: float = spec(gt=0)


@dataclass
class CustomRewardFunctionConfig:
    path: str | None = spec(path=True)
    name: str = spec()
    reward_kwargs: dict[str, Any] = spec()
