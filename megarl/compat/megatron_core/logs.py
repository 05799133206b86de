"""megatron-core log lines megarl's use of it makes meaningless, dropped by exact message (logging
filters; light: installed by ``megarl/__init__.py`` in every process, before megatron is imported).

* WARNING ``GPTModel IS DEPRECATED ...`` (models/gpt/gpt_model.py:118), at every model build: megarl
  builds GPTModel on purpose (its converters, specs and the weight sync are GPTModel's); HybridModel is
  where Megatron-Bridge's Nemotron-H bridge goes, not megarl's models.
* WARNING ``DistributedDataParallel: full_param_layout not provided ...``
  (distributed/distributed_data_parallel.py:133), at every DDP wrap with the distributed optimizer:
  DDP computes the same layout itself (its backward-compatible path).
"""

from __future__ import annotations

import logging

from megarl.compat.shim import Shim, source_has

__all__ = ["SHIMS", "quiet_megatron_logs"]

_GPT_MODEL = "megatron.core.models.gpt.gpt_model"
_DDP = "megatron.core.distributed.distributed_data_parallel"
_PREFIXES = {_GPT_MODEL: "GPTModel IS DEPRECATED", _DDP: "DistributedDataParallel: full_param_layout not provided"}

SHIMS = (
    Shim("log filter: 'GPTModel IS DEPRECATED'", ("megatron-core==0.19.2",), ("cpu", "gpu"),
         "logged at every GPTModel build (gpt_model.py:118)", source_has(_GPT_MODEL, None, _PREFIXES[_GPT_MODEL])),
    Shim("log filter: DDP 'full_param_layout not provided'", ("megatron-core==0.19.2",), ("cpu", "gpu"),
         "logged at every DDP wrap with use_distributed_optimizer (distributed_data_parallel.py:133); the layout "
         "DDP then computes is DistributedOptimizer.compute_full_param_layout's",
         source_has(_DDP, None, "full_param_layout not provided")),
)


class _PrefixFilter(logging.Filter):
    """Drops the records whose unformatted message starts with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(self.prefix))


def quiet_megatron_logs() -> None:
    """Install the filters (idempotent: one per logger)."""
    for name, prefix in _PREFIXES.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _PrefixFilter) for f in logger.filters):
            logger.addFilter(_PrefixFilter(prefix))
