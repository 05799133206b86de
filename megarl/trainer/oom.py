"""What to change when a phase runs out of GPU memory: the keys the memory plan would name for it.

A worker that runs out of GPU memory (torch's ``OutOfMemoryError``, or vLLM's allocator at a wake-up)
reports the GPU's memory by pool with it (megarl.utils.gpu_memory.oom_report); megarl.trainer.failures adds
these keys for the phase the trainer was in, and the plan's command that lists each phase's terms.
"""

from __future__ import annotations

__all__ = ["oom_fix"]

_A, _R, _ROLL, _C = "actor_rollout_ref.actor", "actor_rollout_ref.ref", "actor_rollout_ref.rollout", "critic"
_OFFLOAD = f"{_A}.megatron.param_offload / optimizer_offload, {_R}.megatron.param_offload"
_GENERATE = (f"lower {_ROLL}.gpu_memory_utilization or {_ROLL}.max_num_seqs / max_num_batched_tokens, "
             f"or raise {_ROLL}.tensor_model_parallel_size; offload the trainer's state: {_OFFLOAD}")
# the trainer's phase names (megarl.trainer.ppo_trainer / rollout_stage) -> the keys
KEYS = {
    "gen": _GENERATE, "gen_max": _GENERATE, "validate": _GENERATE,
    # vLLM's weights and then its KV cache wake up in this phase, beside the trainer's resident state
    "weight_sync": f"lower {_ROLL}.gpu_memory_utilization (vLLM's weights and KV cache wake up in this phase) or "
                   f"{_ROLL}.weight_sync.bucket_size_mb; offload the trainer's state: {_OFFLOAD}",
    "old_log_prob": f"lower {_ROLL}.log_prob_micro_batch_size_per_gpu (or log_prob_max_token_len_per_gpu with "
                    f"log_prob_use_dynamic_bsz); {_R}.megatron.param_offload",
    "ref": f"lower {_R}.log_prob_micro_batch_size_per_gpu (or log_prob_max_token_len_per_gpu with "
           f"log_prob_use_dynamic_bsz); {_A}.megatron.param_offload / optimizer_offload",
    "values": f"lower {_C}.ppo_micro_batch_size_per_gpu (or forward_max_token_len_per_gpu with use_dynamic_bsz); {_OFFLOAD}",
    "update_actor": f"lower {_A}.ppo_micro_batch_size_per_gpu (or ppo_max_token_len_per_gpu with use_dynamic_bsz), set "
                    f"{_A}.megatron.override_transformer_config.recompute_granularity=full, raise {_A}.megatron."
                    f"tensor_model_parallel_size / pipeline_model_parallel_size, or {_R}.megatron.param_offload",
    "update_critic": f"lower {_C}.ppo_micro_batch_size_per_gpu (or ppo_max_token_len_per_gpu with use_dynamic_bsz), set "
                     f"{_C}.megatron.override_transformer_config.recompute_granularity=full, or {_OFFLOAD}",
    "teacher": "lower distillation.teacher_models.teacher_model.inference.max_num_seqs or raise its "
               "tensor_model_parallel_size; distillation.nnodes > 0 puts the teacher on its own GPUs",
    "reward_model": "lower reward.reward_model.rollout.max_num_seqs or raise its tensor_model_parallel_size",
}


def oom_fix(phase: str | None) -> str:
    """The fix line of an out-of-memory failure in ``phase``."""
    keys = KEYS.get(phase or "", "change the keys the memory plan names for this phase")
    return (f"{keys}; `python -m megarl.plan` with the same overrides lists each phase's terms (GiB per GPU), "
            "then run the same command again (trainer.resume_mode=auto continues from the latest checkpoint)")
