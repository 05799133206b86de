"""megatron-core's HybridDeviceOptimizer (``optim.override_optimizer_config.optimizer_cpu_offload``): its
host memory, checkpoints and resumes (:func:`fit_hybrid_optimizer`, every device), and the optimizer on a
machine without a GPU, so that its split, its steps and its checkpoints are tested on CPU
(:func:`apply_cpu_hybrid_optimizer`).

On a GPU the hybrid optimizer (megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py) gives the first
``optimizer_offload_fraction`` of its device parameters (by elements, in param-group order) a host copy that
torch's AdamW steps on the CPU, and the rest to the device Adam; gradients go device -> host and updated
weights host -> device on CUDA streams. Without a CUDA driver its construction raises
(``torch.cuda.current_stream()``, ``Tensor.pin_memory()``), and every parameter being a host tensor, it would
split nothing. :func:`apply_cpu_hybrid_optimizer` (CPU runs only) makes it run there as on a GPU: its streams
and events wait on nothing, nothing is page-locked, and while it splits its parameters they report
``is_cuda`` (so do their ``detach`` / ``clone`` / ``float`` copies; a ``.cpu()`` copy does not): the same
parameters get host copies and CPU AdamW instances as on a GPU.

Its host gradient copies are torch pinned allocations, which round each up to a power of two, and the
bf16 staging copies of its split stay in torch's page-locked cache: :func:`fit_hybrid_optimizer` gives it
exact buffers and empties that cache, so its host memory is what the plan counts (megarl.plan.memory).

Its sub-optimizers create their state at their first step. A checkpoint request (megarl builds one for a
save and for a load) reads that state: without it megatron's DistributedOptimizer fails (the precision-aware
path pops a missing ``master_param``; without TE or apex ``state_dict`` asserts one step count), and its
``load_state_dict`` first runs ``HybridDeviceOptimizer.dummy_step()``, an optimizer step on random gradients
that writes into the model's weights. :func:`fit_hybrid_optimizer` gives a stateless hybrid optimizer its
state by that same step at learning rate 0 and weight decay 0, which moves no weight, before the request.
Without TE or apex (CPU; GPUs without TE) the distributed optimizer's load gives every parameter one shared
step tensor, which each torch AdamW sub-optimizer then increments (a wrong bias correction from the next
step on): :func:`fit_hybrid_optimizer` unties them, as :func:`~megarl.compat.megatron_core.optimizer.fit_torch_adam`
does for torch's Adam. The loaded param groups carry the checkpoint's step count, which the hybrid optimizer
copies into its sub-optimizers' groups before every step: TransformerEngine's FusedAdam (its GPU part) counts
its steps there, so it would stay at the saved step + 1 (a frozen bias correction); megarl drops it from the
hybrid optimizer's groups once the sub-optimizers have been rebuilt with it.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from megarl.compat.cuda_on_cpu import TorchCudaToCpu
from megarl.compat.pinned_memory import exact_pinned
from megarl.compat.shim import Shim, source_has

__all__ = ["SHIMS", "apply_cpu_hybrid_optimizer", "fit_hybrid_optimizer"]

MCORE = ("megatron-core==0.19.2",)
_HDO = "megatron.core.optimizer.cpu_offloading.hybrid_optimizer"
_DIST = "megatron.core.optimizer.distrib_optimizer"

SHIMS = (
    Shim(f"{_HDO}.torch", MCORE, ("cpu",),
         "HybridDeviceOptimizer's construction and step() use torch.cuda.current_stream(), torch.cuda.Stream(), "
         "torch.cuda.stream() and stream events, and its host gradient copies torch.empty(pin_memory=True), all of "
         "which need a CUDA driver: its torch is a TorchCudaToCpu",
         source_has(_HDO, "HybridDeviceOptimizer._init_sub_optimizers", "torch.cuda.current_stream()")),
    Shim(f"{_HDO}.HybridDeviceOptimizer._get_sub_optimizer_param_groups", MCORE, ("cpu",),
         "it offloads only parameters with param.is_cuda (none on CPU) and pins their host copies "
         "(.pin_memory() needs a CUDA driver): run under _EmulatedDevice",
         source_has(_HDO, "HybridDeviceOptimizer._get_sub_optimizer_param_groups", "param.is_cuda")),
    Shim("DistributedOptimizer.sharded_state_dict with a HybridDeviceOptimizer", MCORE, ("cpu", "gpu"),
         "a checkpoint request needs the sub-optimizers' state, which their first step creates "
         "(distrib_optimizer.py _get_main_param_and_optimizer_states pops 'master_param'), and load_state_dict "
         "makes it with HybridDeviceOptimizer.dummy_step(), a step on random gradients into the model's weights: "
         "see fit_hybrid_optimizer",
         source_has(_DIST, "DistributedOptimizer.load_state_dict", "self.optimizer.dummy_step()")),
    Shim("HybridDeviceOptimizer's host gradient buffers", MCORE, ("cpu", "gpu"),
         "_set_sub_optimizer_grads makes them with torch.empty(pin_memory=pin_cpu_grads), which torch's pinned allocator "
         "rounds up to a power of two, and its split's pinned bf16 staging copies stay in torch's host cache: exact "
         "buffers given before its first step, the cache emptied (_exact_host_gradients)",
         source_has(_HDO, "HybridDeviceOptimizer._set_sub_optimizer_grads", "pin_memory=self.pin_cpu_grads")),
    Shim("HybridDeviceOptimizer param groups after a load", MCORE, ("cpu", "gpu"),
         "_sync_hdo_param_groups_to_sub_optimizers copies every key of its groups into the sub-optimizers' before each "
         "step, the checkpoint's 'step' too, where TE's FusedAdam counts its steps: dropped after the load",
         source_has(_HDO, "HybridDeviceOptimizer._sync_hdo_param_groups_to_sub_optimizers", "new_group.update(update_group_attrs)")),
    Shim("DistributedOptimizer.load_state_dict with a HybridDeviceOptimizer, without TE or apex", MCORE, ("cpu", "gpu"),
         "without TE or apex it gives every parameter's state one shared step tensor (s['step'] = step, "
         "distrib_optimizer.py load_state_dict), incremented by each torch AdamW sub-optimizer: untied after the load",
         source_has(_DIST, "DistributedOptimizer.load_state_dict", 's["step"] = step')),
)

_ON_DEVICE = "_megarl_on_emulated_device"  # attribute of a CPU tensor that stands for a device tensor
_APPLIED = False


class _EmulatedDevice(TorchFunctionMode):
    """While the hybrid optimizer splits its parameters: the given tensors, and their ``detach`` /
    ``clone`` / ``float`` copies, report ``is_cuda``; ``.cpu()`` gives an alias that does not (the host
    copy); ``pin_memory()`` is the identity."""

    _KEEP_DEVICE = (torch.Tensor.detach, torch.Tensor.clone, torch.Tensor.float)
    _IS_CUDA = torch.Tensor.is_cuda.__get__  # a method-wrapper: equal (not identical) to the one a call passes

    def __init__(self, device_tensors: list[torch.Tensor]) -> None:
        super().__init__()
        for tensor in device_tensors:
            setattr(tensor, _ON_DEVICE, True)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func == self._IS_CUDA:
            return getattr(args[0], _ON_DEVICE, False)
        if func is torch.Tensor.pin_memory:
            return args[0]
        if func is torch.Tensor.cpu:
            return args[0].detach()  # a new tensor object: unmarked
        out = func(*args, **kwargs)
        if func in self._KEEP_DEVICE and getattr(args[0], _ON_DEVICE, False):
            setattr(out, _ON_DEVICE, True)
        return out


def apply_cpu_hybrid_optimizer() -> None:
    """Make megatron-core's HybridDeviceOptimizer run on CPU (process-wide, idempotent; CPU runs only)."""
    global _APPLIED
    if _APPLIED:
        return
    from megatron.core.optimizer.cpu_offloading import hybrid_optimizer

    hybrid_optimizer.torch = TorchCudaToCpu()
    cls = hybrid_optimizer.HybridDeviceOptimizer
    split = cls._get_sub_optimizer_param_groups

    def split_on_emulated_device(self, offload_fraction):
        with _EmulatedDevice([p for group in self.param_groups for p in group["params"]]):
            return split(self, offload_fraction)

    cls._get_sub_optimizer_param_groups = split_on_emulated_device
    _APPLIED = True


def fit_hybrid_optimizer(optimizer) -> None:
    """Fit each HybridDeviceOptimizer inside `optimizer`'s distributed optimizers (in place; see the
    module docstring): exact host gradient buffers, torch's cached page-locked blocks given back, its
    state before a checkpoint request by a step that moves no weight, each parameter its own step count
    after a load."""
    from megatron.core.optimizer.cpu_offloading import HybridDeviceOptimizer
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        if isinstance(opt, DistributedOptimizer) and isinstance(getattr(opt, "optimizer", None), HybridDeviceOptimizer):
            _fit(opt)
            _exact_host_gradients(opt.optimizer)
            init_sub_optimizers = opt.optimizer._init_sub_optimizers

            def init_with_exact_host_gradients(hdo=opt.optimizer, init=init_sub_optimizers):
                init()  # a load rebuilds the sub-optimizers and their host copies
                _exact_host_gradients(hdo)

            opt.optimizer._init_sub_optimizers = init_with_exact_host_gradients


def _exact_host_gradients(hdo) -> None:
    """Host gradient buffers of exactly their size (page-locked with ``pin_cpu_grads`` on a GPU machine)
    for the host sub-optimizers' parameters, where the hybrid optimizer's own (made at its first step)
    are torch pinned allocations rounded up to powers of two (a third more at Qwen3-30B-A3B's expert
    shapes); then torch's cached page-locked blocks are given back: the bf16 staging copies its split
    made (``.cpu().pin_memory()``, dropped after their fp32 copy), twice, as the distributed optimizer
    builds it once over the whole parameters and once over its shards."""
    pinned = hdo.pin_cpu_grads and torch.cuda.is_available()
    for opt in hdo.cpu_optimizers:
        for group in opt.param_groups:
            for param in group["params"]:
                if param in hdo.cpu_copy_map_grad:
                    continue
                nbytes = param.numel() * param.element_size()
                storage = exact_pinned(nbytes) if pinned else torch.UntypedStorage(nbytes)
                buffer = torch.empty(0, dtype=param.dtype).set_(storage, 0, param.shape)
                hdo.cpu_copy_map_grad[param] = param.grad = buffer
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch._C._host_emptyCache()


def _fit(opt) -> None:
    sharded_state_dict, load_state_dict = opt.sharded_state_dict, opt.load_state_dict

    def with_state(*args, **kwargs):
        if not opt.optimizer.state:
            _step_that_moves_nothing(opt.optimizer)
        return sharded_state_dict(*args, **kwargs)

    def untied_load_state_dict(state_dict):
        load_state_dict(state_dict)
        for state in opt.optimizer.state.values():  # the sub-optimizers' own state dicts
            if isinstance(state.get("step"), torch.Tensor):
                state["step"] = state["step"].clone()
        for group in opt.optimizer.param_groups:  # the sub-optimizers were rebuilt with it; they count on
            group.pop("step", None)

    opt.sharded_state_dict = with_state
    opt.load_state_dict = untied_load_state_dict


def _step_that_moves_nothing(hdo) -> None:
    """``dummy_step()`` at lr 0 and weight decay 0: Adam's update and AdamW's decay are both multiplied by
    0, so the weights copied back are the ones the step started from; the state it leaves (step 1, moments
    of random gradients) is what a load overwrites. (A save before any step records step 1.)"""
    bounds = [(group["lr"], group["weight_decay"]) for group in hdo.param_groups]
    for group in hdo.param_groups:
        group["lr"] = group["weight_decay"] = 0.0
        for param in group["params"]:  # a skipped step's gradient (maybe not finite) would be read before dummy_step's
            if hasattr(param, "decoupled_grad"):
                del param.decoupled_grad
    try:
        hdo.dummy_step()
    finally:
        for group, (lr, weight_decay) in zip(hdo.param_groups, bounds):
            group["lr"], group["weight_decay"] = lr, weight_decay
    for inner in hdo.sub_optimizers:  # fp32 copies of the random gradients; a real step gives grad-buffer views
        for group in inner.param_groups:
            for param in group["params"]:
                param.grad = None
