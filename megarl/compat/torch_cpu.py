"""PyPI's torch (a CUDA build) on CI's CPU machines: its one log line about that.

``import torch.utils.cpp_extension`` (megatron and vLLM import it) logs WARNING ``No CUDA runtime is
found, using CUDA_HOME=...`` once per process wherever a CUDA toolkit is installed but no GPU is there,
which is every CPU run on such a machine. Dropped by exact message (a logging filter; light: installed by
``megarl/__init__.py`` in every process).
"""

from __future__ import annotations

import logging

from megarl.compat.shim import Shim, source_has

__all__ = ["SHIMS", "quiet_no_cuda_runtime_log"]

_LOGGER = "torch.utils.cpp_extension"
_MESSAGE = "No CUDA runtime is found, using CUDA_HOME='%s'"

SHIMS = (
    Shim("log filter: torch 'No CUDA runtime is found'", ("torch==2.13.0",), ("cpu",),
         "torch/utils/cpp_extension.py:178 (_find_cuda_home at import)", source_has(_LOGGER, None, _MESSAGE)),
)


class _NoCudaRuntimeFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != _MESSAGE


def quiet_no_cuda_runtime_log() -> None:
    """Install the filter (idempotent)."""
    logger = logging.getLogger(_LOGGER)
    if not any(isinstance(f, _NoCudaRuntimeFilter) for f in logger.filters):
        logger.addFilter(_NoCudaRuntimeFilter())
