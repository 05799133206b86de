import importlib.util
import os
from pathlib import Path

import pytest

# Keep vLLM's CPU KV cache and thread pools small: CI has 2 cores and 24 GiB.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
# vLLM 0.26's CUDA sampler imports flashinfer to ask whether it may use it, unless told not to; the GPU machine's
# shipped stack has no flashinfer (a pip install of vllm brings it).
if importlib.util.find_spec("flashinfer") is None:
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")

if importlib.util.find_spec("absl") is not None:
    # absl's log handler (megatron-core imports absl) closes the stream it was made with when logging is
    # reconfigured (Hydra's job logging in main_ppo.cli) unless that stream is the current sys.stderr; under
    # pytest it is a capture buffer, and closing it broke every later test of the session. The real stderr
    # is one it never closes.
    import sys

    import absl.logging

    absl.logging.get_absl_handler().python_handler.stream = sys.__stderr__


# The default run has two xdist workers, each a file at a time (pytest.ini): the tests pin OMP_NUM_THREADS=1,
# so one process at a time leaves one of CI's two cores idle. Files that share a session fixture costlier
# than its building twice go to one worker together.
WORKER_SHARED_FILES = {  # file -> its group, named after the fixture it shares (in its directory)
    "tests/fault/test_reliability_e2e.py": "tests/fault/four_steps",
    "tests/fault/test_resume_fallback.py": "tests/fault/four_steps",
}
# Their files start whole runs (drivers, Ray, engines), minutes each: handed out first, so that the run does
# not end on one of them alone (xdist's own order, most tests first, left them to the end).
LONG_FILES_FIRST = ("tests/fault/", "tests/trainer/")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadFileScheduling

    class FileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return WORKER_SHARED_FILES.get(path, path)

        def _assign_work_unit(self, node) -> None:
            long = next((scope for scope in self.workqueue if scope.startswith(LONG_FILES_FIRST)), None)
            if long is not None:
                self.workqueue.move_to_end(long, last=False)
            super()._assign_work_unit(node)

    return FileScheduling(config, log) if config.getvalue("dist") == "loadfile" else None


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory) -> Path:
    """The embedded demo's model, train and val sets (megarl.data.demo), built once for the session:
    the runs that only read them share this copy (the model's warm-up takes seconds). Tests of the
    building itself (tests/data) use their own directories."""
    from megarl.data.demo import MODEL_NAME, TRAIN_NAME, VAL_NAME, build_asset

    root = tmp_path_factory.mktemp("demo")
    for name in (MODEL_NAME, TRAIN_NAME, VAL_NAME):
        build_asset(name, root)
    return root
