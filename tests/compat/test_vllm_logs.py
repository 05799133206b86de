"""megarl.compat.vllm.logs drops exactly the vLLM lines it names, nothing else."""

import logging

import pytest

from megarl.compat.vllm.logs import quiet_weight_sync_logs

LAYERWISE = "vllm.model_executor.model_loader.reload.layerwise"
INPLACE = "vllm.model_executor.model_loader.reload.inplace"
BLOCK_POOL = "vllm.v1.core.block_pool"
RENDERER = "vllm.renderers.base"


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def capture():
    quiet_weight_sync_logs()
    quiet_weight_sync_logs()  # idempotent
    handler = Capture()
    loggers = [logging.getLogger(name) for name in (LAYERWISE, INPLACE, BLOCK_POOL, RENDERER)]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG)
    yield handler
    for lg, level in zip(loggers, levels):
        lg.removeHandler(handler)
        lg.setLevel(level)


def exc_info(error: Exception):
    try:
        raise error
    except Exception as raised:
        return (type(raised), raised, raised.__traceback__)


def test_filters_are_installed_once():
    quiet_weight_sync_logs()
    for name in (LAYERWISE, INPLACE, BLOCK_POOL, RENDERER):
        assert len(logging.getLogger(name).filters) == 1, name


def test_drops_only_the_named_lines(capture):
    layerwise = logging.getLogger(LAYERWISE)
    layerwise.warning("%s: Failed to load weights", "RotaryEmbedding")
    layerwise.warning("%s: Failed to load weights", "Llama3RotaryEmbedding")
    layerwise.warning("%s: Failed to load weights", "QKVParallelLinear")  # a weight the sync did not send: kept
    layerwise.warning("RotaryEmbedding: something else")
    logging.getLogger(INPLACE).info("Reloading and processing weights took %.2f seconds", 0.02)
    logging.getLogger(INPLACE).warning("Following weights were not loaded from checkpoint: %s", {"x"})
    logging.getLogger(BLOCK_POOL).info("Successfully reset prefix cache")
    logging.getLogger(BLOCK_POOL).info("Failed to reset prefix cache")
    renderer = logging.getLogger(RENDERER)
    no_tokenizer = ValueError("Tokenizer not available when `skip_tokenizer_init=True`")
    renderer.warning("Chat template warmup failed", exc_info=exc_info(no_tokenizer))
    renderer.warning("Chat template warmup failed", exc_info=exc_info(RuntimeError("jinja broke")))
    assert capture.messages == [
        "QKVParallelLinear: Failed to load weights",
        "RotaryEmbedding: something else",
        "Following weights were not loaded from checkpoint: {'x'}",
        "Failed to reset prefix cache",
        "Chat template warmup failed",
    ]
