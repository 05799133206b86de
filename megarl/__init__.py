"""megarl: RL post-training on Megatron-Core with vLLM rollouts."""

from megarl.compat.megatron_core.fallback_warnings import ignore_fallback_warnings
from megarl.compat.megatron_core.logs import quiet_megatron_logs
from megarl.compat.torch_cpu import quiet_no_cuda_runtime_log

# before any megarl module imports megatron or torch (see those modules)
ignore_fallback_warnings()
quiet_megatron_logs()
quiet_no_cuda_runtime_log()
