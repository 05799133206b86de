"""Schema of `critic`: the value model (trained when GAE needs it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from megarl.config.names import LOSS_AGG_MODES
from megarl.config.schema.actor import ModelConfig
from megarl.config.schema.megatron import CheckpointConfig, MegatronTrainConfig, OptimConfig
from megarl.config.schema.field import Section, spec


@dataclass
class CriticConfig(Section):
    optim: OptimConfig = spec()
    megatron: MegatronTrainConfig = spec()
    rollout_n: int = spec(ge=1)
    strategy: Literal["megatron"] = spec(note="megarl trains with Megatron-Core only (no FSDP)")
    enable: bool | None = spec()
    ppo_mini_batch_size: int = spec(ge=1)
    ppo_micro_batch_size_per_gpu: int | None = spec(ge=1)
    use_dynamic_bsz: bool = spec()
    ppo_max_token_len_per_gpu: int = spec(ge=1)
    forward_max_token_len_per_gpu: int = spec(ge=1)
    ppo_epochs: int = spec(ge=1)
    shuffle: bool = spec()
    data_loader_seed: int | None = spec(ge=0)
    cliprange_value: float = spec(gt=0)
    loss_agg_mode: str = spec(choices=LOSS_AGG_MODES)
    loss_scale_factor: float | None = spec(gt=0)
    checkpoint: CheckpointConfig = spec()
    model: ModelConfig = spec()
    nccl_timeout: int = spec(gt=0)  # seconds: the process-group timeout of the critic workers
