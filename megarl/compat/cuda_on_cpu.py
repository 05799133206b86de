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


class TorchCudaToCpu(types.ModuleType):
    """``torch`` as seen by one dependency module (assigned to its ``torch`` global):
    ``zeros``/``empty``/``tensor`` with ``device="cuda"`` allocate on CPU."""

    def __init__(self) -> None:
        super().__init__("torch")

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
