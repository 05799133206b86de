"""The overrides a user gives to run a small model on this CPU machine (tests use them through
`megarl.config.load_config`, never a hand-built config). Independent of the demo profile, so tuning
the demo does not change what the tests assume."""

from __future__ import annotations

CPU_SMALL: list[str] = [
    "trainer.device=cpu",
    "trainer.n_gpus_per_node=1",
    "trainer.logger=[console]",
    "trainer.total_epochs=1",
    "ray_kwargs.ray_init.num_cpus=2",
    "algorithm.adv_estimator=grpo",
    "data.max_prompt_length=32",
    "data.max_response_length=8",
    "data.train_batch_size=16",
    "data.seed=1",
    "actor_rollout_ref.model.use_remove_padding=false",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.actor.megatron.use_distributed_optimizer=false",
    "actor_rollout_ref.actor.megatron.sequence_parallel=false",  # pinned off; tests/workers/test_megatron_workers.py covers it on
    "actor_rollout_ref.ref.megatron.sequence_parallel=false",
    "critic.megatron.sequence_parallel=false",
    "actor_rollout_ref.actor.megatron.dtype=float32",
    "actor_rollout_ref.ref.megatron.dtype=float32",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32",
    "actor_rollout_ref.rollout.dtype=float32",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.enforce_eager=true",
    "actor_rollout_ref.rollout.enable_chunked_prefill=false",
    "actor_rollout_ref.rollout.n=8",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
    "critic.ppo_micro_batch_size_per_gpu=16",
    "critic.model.use_remove_padding=false",
    "critic.megatron.use_distributed_optimizer=false",
    "critic.megatron.dtype=float32",
]
