"""Workarounds for megatron-core's interleaved (virtual-pipeline) schedule, used by
:func:`megarl.workers.megatron.schedule.run_schedule`."""

from __future__ import annotations

from megarl.compat.shim import Shim

__all__ = ["SHIMS", "needs_uniform_shapes", "unbatched_p2p_at_pp2"]

SHIMS = (
    Shim("interleaved schedule: uniform micro-batch shapes in forward-backward", ("megatron-core==0.19.2",),
         ("cpu", "gpu"),
         "the interleaved schedule hangs on variable shapes in forward-backward (seen at pp = 2, where its "
         "shape exchange, always batched, pairs the two sends to one rank wrongly; forward-only works): every "
         "micro-batch is padded to the pass's largest shape (needs_uniform_shapes). 0.19.2 without it: "
         "tests/workers/test_megatron_workers.py -k vpp fails in p2p _communicate_shapes"),
    Shim("config.batch_p2p_comm at pp = 2", ("megatron-core==0.19.2",), ("cpu", "gpu"),
         "at pp = 2 the previous and next stage are one rank: batched p2p posts two sends to it (activation, "
         "gradient) whose order the receiver's two receives do not follow, so activations and gradients swap "
         "silently (same shape) in the steady state of a training pass with more micro-batches than stages; the "
         "unbatched p2p keeps the two directions apart (unbatched_p2p_at_pp2). 0.19.2 without it: "
         "tests/workers/test_megatron_workers.py -k vpp differs from TP=1"),
)


def needs_uniform_shapes(num_chunks: int, forward_only: bool) -> bool:
    """Whether the model must get every micro-batch at one shape: the interleaved schedule
    (``num_chunks`` > 1 virtual stages) in forward-backward."""
    return num_chunks > 1 and not forward_only


def unbatched_p2p_at_pp2(config, pp_size: int) -> None:
    """``config.batch_p2p_comm = False`` at ``pp_size`` 2 (the interleaved schedule's config)."""
    if pp_size == 2:
        config.batch_p2p_comm = False
