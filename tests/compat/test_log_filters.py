"""megarl.compat's log filters (vLLM: compat.vllm.logs; megatron-core: compat.megatron_core.logs; torch:
compat.torch_cpu) drop exactly the lines they name, nothing else."""

import logging
import subprocess
import sys

import pytest

from megarl.compat.megatron_core.logs import quiet_megatron_logs
from megarl.compat.torch_cpu import quiet_no_cuda_runtime_log
from megarl.compat.vllm.logs import quiet_weight_sync_logs

LAYERWISE = "vllm.model_executor.model_loader.reload.layerwise"
INPLACE = "vllm.model_executor.model_loader.reload.inplace"
BLOCK_POOL = "vllm.v1.core.block_pool"
RENDERER = "vllm.renderers.base"
GPT_MODEL = "megatron.core.models.gpt.gpt_model"
DDP = "megatron.core.distributed.distributed_data_parallel"
CPP_EXTENSION = "torch.utils.cpp_extension"


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


def test_megatron_and_torch_filters_drop_only_the_named_lines():
    quiet_megatron_logs()
    quiet_no_cuda_runtime_log()
    quiet_megatron_logs()  # idempotent
    handler = Capture()
    loggers = [logging.getLogger(name) for name in (GPT_MODEL, DDP, CPP_EXTENSION)]
    for lg in loggers:
        assert len(lg.filters) == 1, lg.name
        lg.addHandler(handler)
    try:
        logging.getLogger(GPT_MODEL).warning("GPTModel IS DEPRECATED. GPTModel is only accepting critical bug fixes")
        logging.getLogger(GPT_MODEL).warning("GPTModel: something else")
        logging.getLogger(DDP).warning("DistributedDataParallel: full_param_layout not provided with "
                                       "use_distributed_optimizer=True. Auto-computing layout inside DDP.")
        logging.getLogger(DDP).warning("DistributedDataParallel: bucket size %d", 7)
        logging.getLogger(CPP_EXTENSION).warning("No CUDA runtime is found, using CUDA_HOME='%s'", "/usr/local")
        logging.getLogger(CPP_EXTENSION).warning("Error checking compiler version for %s", "c++")
        logging.getLogger("mypackage").warning("GPTModel IS DEPRECATED")  # same words elsewhere: kept
    finally:
        for lg in loggers:
            lg.removeHandler(handler)
    assert handler.messages == ["GPTModel: something else", "DistributedDataParallel: bucket size 7",
                                "Error checking compiler version for c++"]


def test_importing_torch_after_megarl_logs_no_cuda_runtime_line():
    """In a fresh process: ``import megarl`` first installs the filter (torch logs the line at import)."""
    proc = subprocess.run([sys.executable, "-c", "import megarl, torch.utils.cpp_extension"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "No CUDA runtime is found" not in proc.stderr, proc.stderr[-2000:]
