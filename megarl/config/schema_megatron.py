"""Schema shared by the Megatron-trained roles: parallel layout, optimizer, checkpoint."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from megarl.config.names import CHECKPOINT_CONTENTS, DTYPES, LR_DECAY_STYLES, OPTIMIZERS
from megarl.config.spec import spec


@dataclass
class MegatronInferConfig:
    """Parallel layout of a forward-only Megatron model (reference, reward model)."""

    tensor_model_parallel_size: int = spec(ge=1)
    pipeline_model_parallel_size: int = spec(ge=1)
    virtual_pipeline_model_parallel_size: int | None = spec(ge=1)
    context_parallel_size: int = spec(ge=1)
    expert_model_parallel_size: int = spec(ge=1)
    expert_tensor_parallel_size: int | None = spec(ge=1)
    sequence_parallel: bool = spec()
    use_dist_checkpointing: bool = spec()
    dist_checkpointing_path: str | None = spec(path=True)
    param_offload: bool = spec()
    seed: int = spec(ge=0)
    dtype: str = spec(choices=DTYPES)
    override_transformer_config: dict[str, Any] = spec()


@dataclass
class MegatronTrainConfig(MegatronInferConfig):
    """Parallel layout plus optimizer-side switches of a trained model (actor, critic)."""

    use_distributed_optimizer: bool = spec()
    grad_offload: bool = spec()
    optimizer_offload: bool = spec()


@dataclass
class OptimConfig:
    optimizer: str = spec(choices=OPTIMIZERS)
    lr: float = spec(gt=0)
    lr_warmup_steps: int = spec(ge=-1)
    lr_warmup_steps_ratio: float = spec(ge=0, le=1)
    lr_decay_style: str = spec(choices=LR_DECAY_STYLES)
    min_lr_ratio: float = spec(ge=0, le=1)
    weight_decay: float = spec(ge=0)
    betas: list[float] = spec(ge=0, lt=1)
    clip_grad: float = spec(gt=0)
    total_training_steps: int = spec(ge=-1)
    use_checkpoint_opt_param_scheduler: bool = spec()


@dataclass
class CheckpointConfig:
    save_contents: list[str] = spec(choices=CHECKPOINT_CONTENTS)
    load_contents: list[str] = spec(choices=CHECKPOINT_CONTENTS)
