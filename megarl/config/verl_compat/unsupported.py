"""Keys from other verl versions or backends (absent from verl 0.9.1's Megatron tree) that megarl
does not accept, with the reason shown to the user.

An unknown key that appears here gets this explanation instead of a did-you-mean.
Keys are matched on their dotted path suffix (e.g. `fsdp_config` anywhere).
"""

from __future__ import annotations

# suffix of the dotted key -> reason / replacement
UNSUPPORTED_VERL_KEYS: dict[str, str] = {
    "fsdp_config": "FSDP is not supported by megarl; use the .megatron section",
    "model.use_fused_kernels_in_megatron": "not a verl 0.9 key",
    "ulysses_sequence_parallel_size": "Ulysses SP is FSDP-only; use megatron.context_parallel_size",
    "micro_batch_size": "deprecated in verl; use micro_batch_size_per_gpu (per rank)",
    "optim.warmup_style": "renamed: use optim.lr_decay_style (constant | linear | cosine | inverse-square-root | WSD)",
    "optim.min_lr_ratio": "verl's Megatron optimizer takes an absolute floor: use optim.min_lr",
    "grad_clip": "verl 0.9 reads the clip norm from optim.clip_grad",
    "ray_init": "verl 0.9 moved it: use ray_kwargs.ray_init.* (and ray_kwargs.timeline_json_file)",
    "critic.forward_micro_batch_size_per_gpu": "not a verl 0.9 key: the critic's value forward uses critic.ppo_micro_batch_size_per_gpu",
    "reward_model.overlong_buffer": "verl 0.9 takes it as reward.reward_kwargs.overlong_buffer_cfg.{enable,len,penalty_factor,log}",
    "reward_model.launch_reward_fn_async": "megarl reads reward.launch_reward_fn_async",
    "distillation.teacher_models": "megarl distils from one teacher, distillation.teacher_models.teacher_model "
                                   "(verl's routing of rows among several teachers by distillation.teacher_key is not implemented)",
    "rollout.moe_tensor_parallel_size": "verl's MoE tensor parallelism for trtllm rollouts (verl refuses it with vllm); megarl's vLLM replicas are tensor-parallel only",
}
