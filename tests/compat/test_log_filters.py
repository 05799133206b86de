"""megarl.compat's megatron-core and torch log filters drop exactly the lines they name, in every megarl process."""

import logging
import subprocess
import sys

from megarl.compat.megatron_core.logs import quiet_megatron_logs
from megarl.compat.torch_cpu import quiet_no_cuda_runtime_log

GPT_MODEL = "megatron.core.models.gpt.gpt_model"
DDP = "megatron.core.distributed.distributed_data_parallel"
CPP_EXTENSION = "torch.utils.cpp_extension"


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_drops_only_the_named_lines():
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
