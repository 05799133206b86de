"""Move a MegatronEngine's parameters, gradient buffers and optimizer state off the device.

Works on storages: every selected tensor's storage is copied to host memory (pinned on
CUDA) and resized to 0 bytes, then re-grown and copied back on `onload`. Views (DDP's
contiguous param/grad buffers, `param.main_grad`) stay valid because the storage object is
the same. On CPU the copy is still made and the original storage still freed, so the path
is exercised and exact there too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch

__all__ = ["Offloader"]


def _optimizers(optimizer) -> list:
    """The MegatronOptimizers inside a ChainedOptimizer (or the optimizer itself)."""
    if optimizer is None:
        return []
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


class Offloader:
    """Offload/onload of the configured state; a no-op when none is set.

    `params`: parameters AND gradient buffers (verl's `megatron.param_offload`);
    `optimizer`: optimizer state (`megatron.optimizer_offload`).
    """

    def __init__(self, engine, *, params: bool, optimizer: bool) -> None:
        self.engine = engine
        self.params, self.optimizer = params, optimizer
        self._stash: list[tuple[torch.UntypedStorage, torch.UntypedStorage]] = []
        self._host_buffers: list[torch.UntypedStorage] = []  # reused across offloads (pinning is slow)

    @property
    def offloaded(self) -> bool:
        return bool(self._stash)

    def _param_tensors(self) -> Iterator[torch.Tensor]:
        for chunk in self.engine.chunks:
            for param in chunk.parameters():
                yield param.data

    def _grad_tensors(self) -> Iterator[torch.Tensor]:
        for chunk in self.engine.chunks:
            # DDP chunks (trained models) hold their grad buffers in lists; a forward-only chunk
            # (reference, reward model) has none (its `buffers` is nn.Module.buffers)
            for name in ("buffers", "expert_parallel_buffers"):
                buffers = getattr(chunk, name, None)
                if isinstance(buffers, list):
                    yield from (buffer.grad_data for buffer in buffers)
            for param in chunk.parameters():
                if param.grad is not None:
                    yield param.grad

    def _optimizer_tensors(self) -> Iterator[torch.Tensor]:
        for opt in _optimizers(self.engine.optimizer):
            torch_opt = getattr(opt, "optimizer", None)
            if torch_opt is None:
                continue
            for state in torch_opt.state.values():
                yield from (v for v in state.values() if isinstance(v, torch.Tensor))
            for group in torch_opt.param_groups:  # fp32 main params of mixed-precision optimizers
                yield from (p.data for p in group["params"])

    def _storages(self) -> list[torch.UntypedStorage]:
        model_storages = {p.untyped_storage().data_ptr() for p in self._param_tensors()}
        selected: list[Iterable[torch.Tensor]] = []
        if self.params:
            selected.append(self._param_tensors())
            selected.append(self._grad_tensors())
        seen: set[int] = set()
        out = []

        def add(tensor: torch.Tensor, skip_model: bool) -> None:
            storage = tensor.untyped_storage()
            ptr = storage.data_ptr()
            if storage.nbytes() == 0 or ptr in seen or (skip_model and ptr in model_storages):
                return
            seen.add(ptr)
            out.append(storage)

        for tensors in selected:
            for tensor in tensors:
                add(tensor, skip_model=False)
        if self.optimizer:
            for tensor in self._optimizer_tensors():
                add(tensor, skip_model=True)  # fp32 optimizers hold the model params themselves
        return out

    def offload(self) -> None:
        if self.offloaded:
            return
        for index, storage in enumerate(self._storages()):
            host = self._host_buffer(index, storage)
            host.copy_(storage)
            storage.resize_(0)
            self._stash.append((storage, host))
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()

    def _host_buffer(self, index: int, storage: torch.UntypedStorage) -> torch.UntypedStorage:
        if index < len(self._host_buffers) and self._host_buffers[index].nbytes() == storage.nbytes():
            return self._host_buffers[index]
        host = torch.UntypedStorage(storage.nbytes(), device="cpu")
        if storage.device.type == "cuda":
            host = host.pin_memory()
        if index < len(self._host_buffers):
            self._host_buffers[index] = host
        else:
            self._host_buffers.append(host)
        return host

    def onload(self) -> None:
        for storage, host in self._stash:
            storage.resize_(host.nbytes())
            storage.copy_(host)
        self._stash = []

    @contextlib.contextmanager
    def onloaded(self):
        """Run a block with the state on device; re-offload afterwards if it was offloaded."""
        was_offloaded = self.offloaded
        if was_offloaded:
            self.onload()
        try:
            yield
        finally:
            if was_offloaded:
                self.offload()
