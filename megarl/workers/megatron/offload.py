"""Move a MegatronEngine's parameters, gradient buffers and optimizer state off the device.

Works on storages: every selected tensor's storage is copied to host memory (pinned on
CUDA) and resized to 0 bytes, then re-grown and copied back on `onload`. Views (DDP's
contiguous param/grad buffers, `param.main_grad`) stay valid because the storage object is
the same. On CPU the copy is still made and the original storage still freed, so the path
is exercised and exact there too.

The state is three groups that move independently, because the phases need different
parts of it: a forward pass (log-probs, the weight sync into vLLM) needs only
:data:`PARAMS`; an update needs :data:`ALL`. Onloading only what a phase needs is what lets
a colocated 7B actor (TP=2: ~7 GiB of bf16 weights, ~14 GiB of fp32 gradients, ~43 GiB of
Adam state per GPU) hand the GPU to vLLM for the sync and the rollout.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from megarl.compat.pinned_memory import exact_pinned

__all__ = ["ALL", "GRADS", "OPTIMIZER", "PARAMS", "Offloader"]

PARAMS, GRADS, OPTIMIZER = "params", "grads", "optimizer"
ALL = (PARAMS, GRADS, OPTIMIZER)


def _optimizers(optimizer) -> list:
    """The MegatronOptimizers inside a ChainedOptimizer (or the optimizer itself)."""
    if optimizer is None:
        return []
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def _on_device(torch_opt) -> list:
    """The torch optimizers whose state lives on the training device: megatron's HybridDeviceOptimizer
    (``optimizer_cpu_offload``) keeps its ``optimizer_offload_fraction`` of the state in host memory for
    good, stepped there by its CPU optimizers; only its device optimizer's state moves."""
    from megatron.core.optimizer.cpu_offloading import HybridDeviceOptimizer

    if isinstance(torch_opt, HybridDeviceOptimizer):
        return [torch_opt.gpu_optimizer] if torch_opt.gpu_optimizer is not None else []
    return [torch_opt]


class Offloader:
    """Offload/onload of the configured groups; groups that are not configured never move.

    `params`: parameters (:data:`PARAMS`); `grads`: gradient buffers (:data:`GRADS`; verl 0.9's
    `megatron.param_offload` sets both, verl <= 0.8's `megatron.grad_offload` this one alone);
    `optimizer`: optimizer state and fp32 main parameters (`megatron.optimizer_offload`: :data:`OPTIMIZER`);
    with megatron's CPU optimizer (`optim.override_optimizer_config.optimizer_cpu_offload`) only the part of
    them it keeps on the device (verl 0.9.1's `offload_megatron_optimizer` too leaves the host part alone).
    """

    def __init__(self, engine, *, params: bool, grads: bool, optimizer: bool) -> None:
        self.engine = engine
        self.configured = tuple(g for g, on in ((PARAMS, params), (GRADS, grads), (OPTIMIZER, optimizer)) if on)
        self._stash: dict[str, list[tuple[torch.UntypedStorage, torch.UntypedStorage]]] = {}
        self._host_buffers: dict[str, list[torch.UntypedStorage]] = {}  # reused across offloads (pinning is slow)

    @property
    def offloaded(self) -> tuple[str, ...]:
        """The groups on the host now."""
        return tuple(g for g in ALL if g in self._stash)

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
            for group in torch_opt.param_groups:  # fp32 main params of mixed-precision optimizers
                yield from (p.data for p in group["params"])
            for inner in _on_device(torch_opt):
                for state in inner.state.values():
                    yield from (v for v in state.values() if isinstance(v, torch.Tensor))
                if inner is not torch_opt:  # the hybrid optimizer's fp32 copies of its device parameters
                    yield from (p.data for group in inner.param_groups for p in group["params"])

    def _storages(self, group: str) -> list[torch.UntypedStorage]:
        """The live storages of ``group``; the optimizer's never include the model's own
        (fp32 optimizers hold the model parameters themselves)."""
        tensors = {PARAMS: self._param_tensors, GRADS: self._grad_tensors, OPTIMIZER: self._optimizer_tensors}[group]()
        skip = {p.untyped_storage().data_ptr() for p in self._param_tensors()} if group == OPTIMIZER else set()
        seen: set[int] = set()
        out = []
        for tensor in tensors:
            storage = tensor.untyped_storage()
            ptr = storage.data_ptr()
            if storage.nbytes() == 0 or ptr in seen or ptr in skip:
                continue
            seen.add(ptr)
            out.append(storage)
        return out

    def offload(self, groups: tuple[str, ...] = ALL) -> None:
        """Move the configured groups among ``groups`` that are on the device to the host,
        then give torch's cached blocks back to the driver (another pool, e.g. vLLM's, may
        take them next)."""
        moved = False
        for group in groups:
            if group not in self.configured or group in self._stash:
                continue
            hosts = self._host_buffers.setdefault(group, [])
            stash = []
            for index, storage in enumerate(self._storages(group)):
                host = self._host_buffer(hosts, index, storage)
                host.copy_(storage)
                storage.resize_(0)
                stash.append((storage, host))
            self._stash[group] = stash
            moved = True
        if moved and torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()

    @staticmethod
    def _host_buffer(hosts: list[torch.UntypedStorage], index: int, storage: torch.UntypedStorage) -> torch.UntypedStorage:
        if index < len(hosts) and hosts[index].nbytes() == storage.nbytes():
            return hosts[index]
        host = exact_pinned(storage.nbytes()) if storage.device.type == "cuda" else torch.UntypedStorage(storage.nbytes())
        if index < len(hosts):
            hosts[index] = host
        else:
            hosts.append(host)
        return host

    def onload(self, groups: tuple[str, ...] = ALL) -> None:
        """Bring the offloaded groups among ``groups`` back to the device, into segments of their own:
        torch's cached blocks (the last pass's activations) go back to the driver first."""
        if any(group in self._stash for group in groups) and torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
        for group in groups:
            for storage, host in self._stash.pop(group, []):
                storage.resize_(host.nbytes())
                storage.copy_(host)

    @contextlib.contextmanager
    def onloaded(self, groups: tuple[str, ...] = ALL):
        """Run a block with ``groups`` on the device; re-offload afterwards what was offloaded."""
        was_offloaded = tuple(g for g in groups if g in self._stash)
        self.onload(was_offloaded)
        try:
            yield
        finally:
            self.offload(was_offloaded)
