"""Schema shared by the Megatron-trained roles: parallel layout, optimizer, checkpoint."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from megarl.config.names import (
    CHECKPOINT_CONTENTS,
    DTYPES,
    GRAD_DTYPES,
    LR_DECAY_STYLES,
    OPTIM_STATE_DTYPES,
    OPTIMIZERS,
    ROUTER_REPLAY_MODES,
    WD_INCR_STYLES,
    WSD_DECAY_STYLES,
)
from megarl.config.schema.field import Section, spec


@dataclass
class MegatronInferConfig(Section):
    """Parallel layout of a forward-only Megatron model (reference)."""

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
    use_remove_padding: bool = spec()  # false: padded rows even when model.use_remove_padding packs them
    seed: int = spec(ge=0)
    dtype: str = spec(choices=DTYPES)
    override_transformer_config: dict[str, Any] = spec()


@dataclass
class MegatronTrainConfig(MegatronInferConfig):
    """Parallel layout plus optimizer-side switches of a trained model (actor, critic)."""

    use_distributed_optimizer: bool = spec()
    optimizer_offload: bool = spec()
    grad_offload: bool = spec()  # verl <= 0.8's key: gradient buffers alone (param_offload moves them too)
    # how the distributed optimizer's state is laid out in a checkpoint (megatron's
    # distrib_optim_sharding_type, as verl): false = dp_reshardable, true = fully_reshardable
    dist_ckpt_optim_fully_reshardable: bool = spec()
    distrib_optim_fully_reshardable_mem_efficient: bool = spec()
    use_megatron_fsdp: bool = spec()  # Megatron-FSDP instead of DDP (megarl.models.data_parallel)


@dataclass
class RouterReplayConfig(Section):
    """verl's `megatron.router_replay` (MoE routing replay, megarl.workers.megatron.router_replay):
    disabled = each router picks its own experts; R3 = the experts vLLM chose for each token during the
    rollout (rollout.enable_rollout_routing_replay); R2 = the experts of the old-log-prob pass, replayed in
    the update."""

    mode: str = spec(choices=ROUTER_REPLAY_MODES)


@dataclass
class ActorMegatronConfig(MegatronTrainConfig):
    """The actor's `megatron` section: a trained model's layout plus its routing replay."""

    router_replay: RouterReplayConfig = spec()


@dataclass
class RefMegatronConfig(MegatronInferConfig):
    """The reference's `megatron` section: a forward-only layout plus its routing replay."""

    router_replay: RouterReplayConfig = spec()


@dataclass
class OptimConfig(Section):
    """verl's McoreOptimizerConfig: Megatron optimizer + OptimizerParamScheduler."""

    optimizer: str = spec(choices=OPTIMIZERS)
    lr: float = spec(gt=0)
    lr_warmup_init: float = spec(ge=0)
    lr_warmup_steps: int = spec(ge=-1)
    lr_warmup_steps_ratio: float = spec(ge=0, le=1)
    lr_decay_steps: int | None = spec(ge=1)
    lr_decay_style: str = spec(choices=LR_DECAY_STYLES)
    min_lr: float = spec(ge=0)
    lr_wsd_decay_style: str = spec(choices=WSD_DECAY_STYLES)
    lr_wsd_decay_steps: int | None = spec(ge=1)
    weight_decay: float = spec(ge=0)
    weight_decay_incr_style: str = spec(choices=WD_INCR_STYLES)
    betas: list[float] = spec(ge=0, lt=1)
    clip_grad: float = spec(gt=0)
    total_training_steps: int = spec(ge=-1)
    use_checkpoint_opt_param_scheduler: bool = spec()
    use_precision_aware_optimizer: bool = spec()
    main_grads_dtype: str = spec(choices=GRAD_DTYPES)
    exp_avg_dtype: str = spec(choices=OPTIM_STATE_DTYPES)
    exp_avg_sq_dtype: str = spec(choices=OPTIM_STATE_DTYPES)
    override_optimizer_config: dict[str, Any] = spec()


def cpu_offload_fraction(overrides: Mapping[str, Any]) -> float:
    """The share of the fp32 main parameters and Adam state Megatron's CPU optimizer (HybridDeviceOptimizer)
    keeps and steps in host memory: ``optimizer_offload_fraction`` of an ``override_optimizer_config`` with
    ``optimizer_cpu_offload`` set, else 0. Absent fields take Megatron OptimizerConfig's defaults (off, 0.0)."""
    if not overrides.get("optimizer_cpu_offload", False):
        return 0.0
    return float(overrides.get("optimizer_offload_fraction", 0.0))


@dataclass
class CheckpointConfig(Section):
    save_contents: list[str] = spec(choices=CHECKPOINT_CONTENTS)
    load_contents: list[str] = spec(choices=CHECKPOINT_CONTENTS)


# Megatron OptimizerConfig fields megarl sets from a typed key (relative to the role's section):
# `override_optimizer_config` may not set them (one value, one key).
OPTIMIZER_FIELDS_FROM_KEYS: dict[str, str] = {
    "optimizer": "optim.optimizer",
    "lr": "optim.lr",
    "min_lr": "optim.min_lr",
    "weight_decay": "optim.weight_decay",
    "adam_beta1": "optim.betas",
    "adam_beta2": "optim.betas",
    "clip_grad": "optim.clip_grad",
    "use_precision_aware_optimizer": "optim.use_precision_aware_optimizer",
    "main_grads_dtype": "optim.main_grads_dtype",
    "exp_avg_dtype": "optim.exp_avg_dtype",
    "exp_avg_sq_dtype": "optim.exp_avg_sq_dtype",
    "use_distributed_optimizer": "megatron.use_distributed_optimizer",
    "bf16": "megatron.dtype",
    "fp16": "megatron.dtype",
    "params_dtype": "megatron.dtype",
}
