"""verl keys megarl deliberately does not accept, with the reason shown to the user.

An unknown key that appears here gets this explanation instead of a did-you-mean.
Keys are matched on their dotted path suffix (e.g. `fsdp_config` anywhere).
"""

from __future__ import annotations

# suffix of the dotted key -> reason / replacement
UNSUPPORTED_VERL_KEYS: dict[str, str] = {
    "data.image_key": "multimodal data is not supported by megarl",
    "data.video_key": "multimodal data is not supported by megarl",
    "model.lora_rank": "LoRA is not supported by megarl (full-parameter training only)",
    "model.lora_alpha": "LoRA is not supported by megarl (full-parameter training only)",
    "model.target_modules": "LoRA is not supported by megarl (full-parameter training only)",
    "model.lora_adapter_path": "LoRA is not supported by megarl (full-parameter training only)",
    "model.external_lib": "not supported by megarl: only the built-in architectures are supported",
    "model.use_fused_kernels": "not supported by megarl",
    "model.enable_activation_offload": "not supported by megarl; use megatron.param_offload (params and grads)/optimizer_offload",
    "fsdp_config": "FSDP is not supported by megarl; use the .megatron section",
    "ulysses_sequence_parallel_size": "Ulysses SP is FSDP-only; use megatron.context_parallel_size",
    "use_torch_compile": "not supported by megarl (Megatron-Core kernels are used as is)",
    "ppo_micro_batch_size": "deprecated in verl; use ppo_micro_batch_size_per_gpu (per rank)",
    "log_prob_micro_batch_size": "deprecated in verl; use log_prob_micro_batch_size_per_gpu (per rank)",
    "micro_batch_size": "deprecated in verl; use micro_batch_size_per_gpu (per rank)",
    "optim.warmup_style": "renamed: use optim.lr_decay_style (constant | linear | cosine)",
    "trainer.default_hdfs_dir": "HDFS is not supported by megarl; use trainer.default_local_dir",
    "trainer.use_legacy_worker_impl": "not applicable: megarl has one worker implementation",
}
