"""megatron-core patches: CPU stand-ins for its CUDA paths (:mod:`.cpu`) and for fla's gated DeltaNet kernels
(:mod:`.gdn_torch`) and mamba-ssm's Mamba-2 kernels (:mod:`.mamba_torch`), its optimizer on CPU and with torch's Adam (:mod:`.optimizer`), its CPU optimizer's host
memory, checkpoints and CPU runs (:mod:`.hybrid_optimizer`), interleaved-schedule workarounds (:mod:`.schedule`), the
checkpoint writer's lost write errors (:mod:`.checkpoint_write`), its import-time fallback warnings
(:mod:`.fallback_warnings`) and log lines (:mod:`.logs`). Nothing here is imported by this package
itself: the warning filter runs in every process before megatron is imported."""
