"""Schema of `actor_rollout_ref`: model, actor, reference and vLLM rollout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from megarl.config.names import (
    DTYPES,
    KL_PENALTIES,
    LOAD_FORMATS,
    LOSS_AGG_MODES,
    LORA_A_INITS,
    POLICY_LOSSES,
    ROLLOUT_MODES,
    TOOL_PARSERS,
    TRUNCATE_SIDES,
)
from megarl.config.schema.megatron import (
    ActorMegatronConfig,
    CheckpointConfig,
    OptimConfig,
    RefMegatronConfig,
)
from megarl.config.schema.field import Section, spec


@dataclass
class ModelConfig(Section):
    path: str | None = spec(path=True)
    tokenizer_path: str | None = spec(path=True)
    trust_remote_code: bool = spec()
    override_config: dict[str, Any] = spec()
    use_remove_padding: bool = spec()


@dataclass
class LoraConfig(Section):
    """`actor_rollout_ref.model.lora` (verl's Megatron LoRA keys; rank 0 = full-parameter training).
    Adapters on Megatron's linear layers, see megarl/models/lora.py."""

    type: Literal["lora"] = spec(note="megarl implements plain LoRA (Megatron-Bridge's dora / canonical_lora are not)")
    rank: int = spec(ge=0)
    alpha: float = spec(gt=0)
    target_modules: list[str] = spec()
    exclude_modules: list[str] = spec()
    lora_A_init_method: str = spec(choices=LORA_A_INITS)
    lora_B_init_method: Literal["zero"] = spec(note="a zero B makes the adapted model start as the base model")


@dataclass
class PolicyModelConfig(ModelConfig):
    """`actor_rollout_ref.model`: the critic's keys plus the chat template prompts are rendered with,
    and the actor's LoRA adapters."""

    custom_chat_template: str | None = spec()
    lora: LoraConfig = spec()


@dataclass
class PolicyLossConfig(Section):
    loss_mode: str = spec(choices=POLICY_LOSSES)
    clip_cov_ratio: float = spec(gt=0, le=1)
    clip_cov_lb: float = spec()
    clip_cov_ub: float = spec()
    kl_cov_ratio: float = spec(gt=0, le=1)
    ppo_kl_coef: float = spec(ge=0)
    dro_beta: float | None = spec(gt=0)


@dataclass
class ActorConfig(Section):
    rollout_n: int = spec(ge=1)
    strategy: Literal["megatron"] = spec(note="megarl trains with Megatron-Core only (no FSDP)")
    ppo_mini_batch_size: int = spec(ge=1)
    ppo_micro_batch_size_per_gpu: int | None = spec(ge=1)
    use_dynamic_bsz: bool = spec()
    ppo_max_token_len_per_gpu: int = spec(ge=1)
    clip_ratio: float = spec(gt=0)
    clip_ratio_low: float | None = spec(gt=0)
    clip_ratio_high: float | None = spec(gt=0)
    clip_ratio_c: float = spec(gt=1)
    tau_pos: float = spec(gt=0)
    tau_neg: float = spec(gt=0)
    policy_loss: PolicyLossConfig = spec()
    loss_agg_mode: str = spec(choices=LOSS_AGG_MODES)
    loss_scale_factor: float | None = spec(gt=0)
    entropy_coeff: float = spec(ge=0)
    calculate_sum_pi_squared: bool = spec()
    use_kl_loss: bool = spec()
    kl_loss_coef: float = spec(ge=0)
    kl_loss_type: str = spec(choices=KL_PENALTIES)
    ppo_epochs: int = spec(ge=1)
    shuffle: bool = spec()
    data_loader_seed: int = spec(ge=0)
    optim: OptimConfig = spec()
    checkpoint: CheckpointConfig = spec()
    megatron: ActorMegatronConfig = spec()


@dataclass
class RefConfig(Section):
    strategy: Literal["megatron"] = spec(note="megarl runs the reference on Megatron-Core only")
    log_prob_micro_batch_size_per_gpu: int | None = spec(ge=1)
    log_prob_use_dynamic_bsz: bool = spec()
    log_prob_max_token_len_per_gpu: int = spec(ge=1)
    megatron: RefMegatronConfig = spec()


@dataclass
class EngineKwargs(Section):
    vllm: dict[str, Any] = spec()


@dataclass
class ValKwargs(Section):
    top_k: int = spec(ge=-1)
    top_p: float = spec(gt=0, le=1)
    temperature: float = spec(ge=0)
    n: int = spec(ge=1)
    do_sample: bool = spec()


@dataclass
class CheckpointEngineConfig(Section):
    update_weights_bucket_megabytes: int = spec(ge=1)


@dataclass
class WeightSyncConfig(Section):
    bucket_size_mb: int = spec(ge=1)
    integrity_check: bool = spec()


@dataclass
class MultiTurnConfig(Section):
    """`actor_rollout_ref.rollout.multi_turn`: the tool agent loop (rollout.mode=async)."""

    enable: bool = spec()
    max_assistant_turns: int | None = spec(ge=1)
    max_user_turns: int | None = spec(ge=1)
    max_parallel_calls: int = spec(ge=1)
    max_tool_response_length: int = spec(ge=1)
    tool_response_truncate_side: str = spec(choices=TRUNCATE_SIDES)
    tool_config_path: str | None = spec(path=True)
    tool_timeout_s: float = spec(gt=0)
    interaction_config_path: str | None = spec(path=True)
    format: str = spec(choices=TOOL_PARSERS)


@dataclass
class AgentConfig(Section):
    """`actor_rollout_ref.rollout.agent`: which agent loop runs each sample (rollout.mode=async)."""

    default_agent_loop: str = spec()
    agent_loop_config_path: str | None = spec(path=True)


@dataclass
class RolloutConfig(Section):
    name: Literal["vllm"] = spec(note="megarl generates with vLLM only (no sglang/hf rollout)")
    mode: str = spec(choices=ROLLOUT_MODES)
    nnodes: int = spec(ge=0)
    n_gpus_per_node: int = spec(ge=1)
    temperature: float = spec(gt=0)
    top_k: int = spec(ge=-1)
    top_p: float = spec(gt=0, le=1)
    prompt_length: int = spec(ge=1)
    response_length: int = spec(ge=1)
    dtype: str = spec(choices=DTYPES)
    gpu_memory_utilization: float = spec(gt=0, le=1)
    ignore_eos: bool = spec()
    enforce_eager: bool = spec()
    free_cache_engine: bool = spec()
    load_format: str = spec(choices=LOAD_FORMATS)
    tensor_model_parallel_size: int = spec(ge=1)
    expert_parallel_size: int = spec(ge=1)
    data_parallel_size: int = spec(ge=1)
    max_num_batched_tokens: int = spec(ge=1)
    max_model_len: int | None = spec(ge=1)
    max_num_seqs: int = spec(ge=1)
    enable_chunked_prefill: bool = spec()
    enable_prefix_caching: bool = spec()
    do_sample: bool = spec()
    n: int = spec(ge=1)
    seed: int = spec(ge=0)
    calculate_log_probs: bool = spec()
    enable_rollout_routing_replay: bool = spec()
    log_prob_micro_batch_size_per_gpu: int | None = spec(ge=1)
    log_prob_use_dynamic_bsz: bool = spec()
    log_prob_max_token_len_per_gpu: int = spec(ge=1)
    engine_kwargs: EngineKwargs = spec()
    val_kwargs: ValKwargs = spec()
    checkpoint_engine: CheckpointEngineConfig = spec()
    weight_sync: WeightSyncConfig = spec()
    multi_turn: MultiTurnConfig = spec()
    agent: AgentConfig = spec()


@dataclass
class ActorRolloutRefConfig(Section):
    hybrid_engine: bool = spec()
    model: PolicyModelConfig = spec()
    actor: ActorConfig = spec()
    ref: RefConfig = spec()
    rollout: RolloutConfig = spec()
    nccl_timeout: int = spec(gt=0)  # seconds: the process-group timeout of the actor/rollout/ref workers
