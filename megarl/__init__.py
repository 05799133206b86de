"""megarl: RL post-training on Megatron-Core with vLLM rollouts."""

from megarl.compat.megatron_core.fallback_warnings import ignore_fallback_warnings

ignore_fallback_warnings()  # before any megarl module imports megatron (see that module)
