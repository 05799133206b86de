"""torch helpers the CPU shims share: a module-level ``torch`` that allocates ``device="cuda"``
on CPU (page-locking nothing) and whose CUDA streams and events wait on nothing, and ``Tensor.cuda``
as the identity for the length of one call."""

from __future__ import annotations

import contextlib
import functools
import types

import torch

__all__ = ["TorchCudaToCpu", "tensor_cuda_is_identity", "without_cuda_moves"]


def _cpu_if_cuda(kwargs: dict) -> dict:
    device = kwargs.get("device")
    if device is not None and torch.device(device).type == "cuda":
        kwargs["device"] = "cpu"
    kwargs.pop("pin_memory", None)  # page-locking needs a CUDA driver
    return kwargs


class _NullEvent:
    """A CUDA event stand-in: recorded work is already done on CPU."""

    def synchronize(self) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass


class _NullStream:
    """A CUDA stream stand-in: there is nothing to wait for on CPU."""

    def wait_event(self, event) -> None:
        pass

    def wait_stream(self, stream) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def record_event(self, event=None) -> _NullEvent:
        return _NullEvent()


class _CudaOnCpu(types.ModuleType):
    """``torch.cuda`` whose ``current_stream()`` and new ``Stream()`` are :class:`_NullStream` and whose
    ``stream(s)`` context does nothing; the rest is torch.cuda's (looked up at each call, so
    process-wide patches of it apply)."""

    def __init__(self) -> None:
        super().__init__("torch.cuda")

    def __getattr__(self, name: str):
        return getattr(torch.cuda, name)

    @staticmethod
    def current_stream(device=None) -> _NullStream:
        return _NullStream()

    @staticmethod
    def Stream(*args, **kwargs) -> _NullStream:  # noqa: N802 (torch.cuda's name)
        return _NullStream()

    @staticmethod
    def stream(stream) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


class TorchCudaToCpu(types.ModuleType):
    """``torch`` as seen by one dependency module (assigned to its ``torch`` global):
    ``zeros``/``empty``/``tensor`` with ``device="cuda"`` (or ``pin_memory=True``) allocate plain CPU
    memory, and ``cuda``'s streams and events wait on nothing."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.cuda = _CudaOnCpu()

    def __getattr__(self, name: str):
        return getattr(torch, name)

    @staticmethod
    def zeros(*args, **kwargs):
        return torch.zeros(*args, **_cpu_if_cuda(kwargs))

    @staticmethod
    def empty(*args, **kwargs):
        return torch.empty(*args, **_cpu_if_cuda(kwargs))

    @staticmethod
    def tensor(*args, **kwargs):
        return torch.tensor(*args, **_cpu_if_cuda(kwargs))


@contextlib.contextmanager
def tensor_cuda_is_identity():
    """``Tensor.cuda`` returns the tensor itself while the block runs."""
    original = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    try:
        yield
    finally:
        torch.Tensor.cuda = original


def without_cuda_moves(method):
    """``method`` run under :func:`tensor_cuda_is_identity`."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        with tensor_cuda_is_identity():
            return method(*args, **kwargs)

    return wrapper
