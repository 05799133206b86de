"""megarl: RL post-training on Megatron-Core with vLLM rollouts."""
