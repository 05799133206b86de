"""Schema of `critic`: the value model (trained when GAE needs it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from megarl.config import names
from megarl.config.schema_megatron import CheckpointConfig, MegatronTrainConfig, OptimConfig
from megarl.config.spec import spec


@dataclass
class CriticModelConfig:
    path: str = spec(path=True)
    tokenizer_path: str | None = spec(path=True)
    override_config: dict[str, Any] = spec()
    trust_remote_code: bool = spec()
    enable_gradient_checkpointing: bool = spec()
    use_remove_padding: bool = spec()


@dataclass
class CriticConfig:
    enable: bool | None = spec()
    optim: OptimConfig = spec()
    model: CriticModelConfig = spec()
    megatron: MegatronTrainConfig = spec()
    rollout_n: int = spec(ge=1)
    ppo_mini_batch_size: int = spec(ge=1)
    ppo_micro_batch_size_per_gpu: int | None = spec(ge=1)
    use_dynamic_bsz: bool = spec()
    ppo_max_token_len_per_gpu: int = spec(ge=1)
    forward_max_token_len_per_gpu: int = spec(ge=1)
    ppo_epochs: int = spec(ge=1)
    shuffle: bool = spec()
    data_loader_seed: int = spec(ge=0)
    cliprange_value: float = spec(gt=0)
    loss_agg_mode: str = spec(choices=names.loss_agg_modes)
    loss_scale_factor: float | None = spec(gt=0)
    grad_clip: float = spec(gt=0)
    checkpoint: CheckpointConfig = spec()
