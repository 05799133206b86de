"""torch helpers the CPU shims share: a module-level ``torch`` that allocates ``device="cuda"``
on CPU, and ``Tensor.cuda`` as the identity for the length of one call."""

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
    return kwargs


class _NullStream:
    """A CUDA stream stand-in: there is nothing to wait for on CPU."""

    def wait_event(self, event) -> None:
        pass

    def wait_stream(self, stream) -> None:
        pass

    def synchronize(self) -> None:
        pass


class _CudaOnCpu(types.ModuleType):
    """``torch.cuda`` whose ``current_stream()`` is a :class:`_NullStream`; the rest is torch.cuda's
    (looked up at each call, so process-wide patches of it apply)."""

    def __init__(self) -> None:
        super().__init__("torch.cuda")

    def __getattr__(self, name: str):
        return getattr(torch.cuda, name)

    @staticmethod
    def current_stream(device=None) -> _NullStream:
        return _NullStream()


class TorchCudaToCpu(types.ModuleType):
    """``torch`` as seen by one dependency module (assigned to its ``torch`` global):
    ``zeros``/``empty``/``tensor`` with ``device="cuda"`` allocate on CPU, and
    ``cuda.current_stream()`` is a stream that waits on nothing."""

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
