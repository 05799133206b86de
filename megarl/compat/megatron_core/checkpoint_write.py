"""megatron-core 0.19.2's checkpoint writer: a failed write keeps its reason in the exception.

``FileSystemWriterAsync.write_preloaded_data`` returns ``(worker, exception)`` when writing a shard
fails; ``write_preloaded_data_multithread`` then asserts the result is a list, and its handler makes
``RuntimeError("An error is caught while starting worker 0, error: <class 'RuntimeError'>")`` from the
assertion: the reason (a full disk is torch's "unexpected pos 704 vs 598") reaches only megatron's
log, not the exception megarl explains (:mod:`megarl.utils.storage` names a full disk from it).
0.16.1 passed the worker's exception on. With the patch the in-process worker raises the exception
inside that handler, whose message then ends with its text. Applied by
:func:`megarl.workers.megatron.checkpoint.save_checkpoint`; megarl saves with one writer per rank
(``thread_count=1``), so the threaded workers, which must report through their queue, are unchanged.
"""

from __future__ import annotations

import functools

from megarl.compat.shim import Shim, source_has

__all__ = ["SHIMS", "keep_write_errors"]

_WRITER = "megatron.core.dist_checkpointing.strategies.filesystem_async"

SHIMS = (
    Shim("FileSystemWriterAsync.write_preloaded_data (the in-process worker raises its write error)",
         ("megatron-core==0.19.2",), ("cpu", "gpu"),
         "filesystem_async.py write_preloaded_data_multithread's check_local_output asserts the worker's result "
         "is a list (message: its type) and the handler wraps that assertion, so a failed write's reason "
         "(ENOSPC, torch's short write) is lost from the exception",
         source_has(_WRITER, "FileSystemWriterAsync.write_preloaded_data_multithread",
                    "assert isinstance(local_results_or_exc, list), type(local_results_or_exc)")),
)

_APPLIED = False


def keep_write_errors() -> None:
    """Patch ``FileSystemWriterAsync.write_preloaded_data`` (once, process-wide)."""
    global _APPLIED
    if _APPLIED:
        return
    from megatron.core.dist_checkpointing.strategies.filesystem_async import FileSystemWriterAsync

    write = FileSystemWriterAsync.write_preloaded_data

    @functools.wraps(write)
    def write_or_raise(*args, **kwargs):
        output = write(*args, **kwargs)
        if output is not None and isinstance(output[1], BaseException):  # the in-process worker failed
            raise output[1]
        return output

    FileSystemWriterAsync.write_preloaded_data = staticmethod(write_or_raise)
    _APPLIED = True
