"""megatron-core's optimizer on CPU, with torch's Adam, and with SGD checkpoints.

Used by :func:`megarl.workers.megatron.optim.build_optimizer`: :func:`apply_cpu_optimizer` and
:func:`cpu_params_pass_cuda_type_checks` on CPU, :func:`fit_torch_adam`, :func:`init_sgd_state` and
:func:`match_param_groups_without_lr_bounds` on every device.
"""

from __future__ import annotations

import contextlib

import torch

from megarl.compat.cuda_on_cpu import TorchCudaToCpu, without_cuda_moves
from megarl.compat.shim import Shim, source_has

__all__ = [
    "SHIMS", "apply_cpu_optimizer", "cpu_params_pass_cuda_type_checks", "fit_torch_adam", "init_sgd_state",
    "match_param_groups_without_lr_bounds",
]

MCORE = ("megatron-core==0.19.2",)
_OPT = "megatron.core.optimizer"

SHIMS = (
    Shim("torch.Tensor.type while building the optimizer", MCORE, ("cpu",),
         "DistributedOptimizer and Float16OptimizerWithFloat16Params sort parameters by "
         "param.type() in ['torch.cuda.HalfTensor', 'torch.cuda.BFloat16Tensor'] and raise TypeError for "
         "anything else (distrib_optimizer.py, optimizer.py): a CPU float tensor names its CUDA type",
         source_has(f"{_OPT}.distrib_optimizer", None, "'torch.cuda.BFloat16Tensor'")),
    Shim("megatron.core.optimizer.clip_grads.torch / optimizer.torch", MCORE, ("cpu",),
         'FP32Optimizer and the grad-norm helpers allocate with a literal device="cuda": their torch is a '
         "TorchCudaToCpu",
         source_has(f"{_OPT}.clip_grads", None, "device='cuda'")),
    Shim("megatron.core.optimizer.optimizer.clip_grad_by_total_norm_fp32", MCORE, ("cpu",),
         "it asserts param.grad.type() == 'torch.cuda.FloatTensor': replaced by the same scaling without "
         "the assertion",
         source_has(f"{_OPT}.clip_grads", "clip_grad_by_total_norm_fp32", "torch.cuda.FloatTensor")),
    Shim("megatron.core.optimizer.clip_grads.l2_norm_impl", MCORE, ("cpu",),
         "without apex/TE the pure-torch local_multi_tensor_l2_norm returns a 'cuda' tensor: a CPU one",
         source_has("megatron.core.utils", "local_multi_tensor_l2_norm", 'device="cuda"')),
    Shim("DistributedOptimizer.get_parameter_state_dp_zero", MCORE, ("cpu",),
         "the fully_reshardable checkpoint format's state gather moves its send buffer with .cuda(): the "
         "identity here (every group is gloo)",
         source_has(f"{_OPT}.distrib_optimizer", "DistributedOptimizer.get_parameter_state_dp_zero", ".cuda()")),
    Shim("DistributedOptimizer with torch.optim.Adam/AdamW", MCORE, ("cpu", "gpu"),
         "without TE or apex megatron runs torch's Adam (a step tensor per parameter, created at the first "
         "step) where the distributed optimizer assumes a fused Adam with the step in the param group "
         "(assert len(steps) == 1 in sharded_state_dict / load_state_dict): see fit_torch_adam",
         source_has(f"{_OPT}.distrib_optimizer", "DistributedOptimizer", "len(steps) == 1")),
    Shim("DistributedOptimizer.sharded_param_state_fsdp_dtensor with torch.optim.Adam/AdamW", MCORE, ("cpu", "gpu"),
         "Megatron-FSDP's fsdp_dtensor checkpoint saves torch Adam's per-parameter step as a replicated tensor, "
         "which differs over DP where a rank's shard is empty (never stepped): see fit_torch_adam",
         source_has(f"{_OPT}.distrib_optimizer", "DistributedOptimizer.sharded_param_state_fsdp_dtensor",
                    "packed_state")),
    Shim("megatron.core.optimizer param_group_identifier_keys", MCORE, ("cpu", "gpu"),
         "a load matches saved param groups to the current ones by their lr/wd bounds too (optimizer.py:139, "
         "used by _filter_and_reorder_param_groups and DistributedOptimizer.load_state_dict), so a resume with "
         "another lr fails ('Could not find parameter group with key'); megarl's scheduler sets those bounds "
         "after the load (ConfigOptimizerParamScheduler, use_checkpoint_opt_param_scheduler): groups are matched "
         "without them (match_param_groups_without_lr_bounds)",
         source_has(f"{_OPT}.optimizer", None, "*_param_group_override_keys()")),
    Shim("megatron optimizer init_state_fn for SGD", MCORE, ("cpu", "gpu"),
         "megatron builds the optimizer part of a checkpoint request from existing state and ships no init "
         "function for SGD (optimizer/__init__.py: init_state_fn only for Adam): zero momentum buffers",
         source_has(f"{_OPT}", None, "init_state_fn = None")),
)

_CPU_APPLIED = False
# The param-group fields megarl's lr / weight-decay scheduler sets after a load (from the checkpoint or
# the config, by use_checkpoint_opt_param_scheduler): not what tells one group from another.
_SCHEDULED_BOUNDS = ("max_lr", "min_lr", "start_wd", "end_wd")
_CUDA_TYPE_NAMES = {"torch.FloatTensor": "torch.cuda.FloatTensor", "torch.HalfTensor": "torch.cuda.HalfTensor",
                    "torch.BFloat16Tensor": "torch.cuda.BFloat16Tensor"}


@contextlib.contextmanager
def cpu_params_pass_cuda_type_checks():
    """While megatron-core builds an optimizer on CPU: ``Tensor.type()`` (no argument)
    names a CPU float tensor by its CUDA type name.

    The constructors of its DistributedOptimizer and of Float16OptimizerWithFloat16Params (bf16
    parameters) sort parameters into fp16/bf16 vs fp32 groups by
    ``param.type() in ['torch.cuda.HalfTensor', 'torch.cuda.BFloat16Tensor']`` and raise
    TypeError for anything else; the dtype is all the check needs. Nothing else in them is
    CUDA-bound on CPU beyond what :mod:`megarl.compat.megatron_core.cpu` and
    :func:`apply_cpu_optimizer` redirect, and gloo has the reduce-scatter / all-gather.
    """
    original = torch.Tensor.type

    def type_(self, dtype=None, non_blocking=False, **kwargs):
        if dtype is None and not kwargs:
            name = original(self)
            return _CUDA_TYPE_NAMES.get(name, name)
        return original(self, dtype, non_blocking, **kwargs)

    torch.Tensor.type = type_
    try:
        yield
    finally:
        torch.Tensor.type = original


def apply_cpu_optimizer() -> None:
    """megatron-core's fp32 optimizer path on CPU (idempotent; CPU runs only).

    `FP32Optimizer` and the grad-norm / clip helpers allocate with a literal
    `device="cuda"`, and `clip_grad_by_total_norm_fp32` asserts `torch.cuda.FloatTensor`
    grads. The first is redirected like the pipeline schedules (:mod:`megarl.compat.megatron_core.cpu`),
    the second replaced by the same scaling without the device assertion, and megatron's
    pure-torch l2-norm fallback (which returns a "cuda" tensor) by a CPU one. The distributed
    optimizer's state gather for the ``fully_reshardable`` checkpoint format moves its send buffer
    with ``.cuda()`` (the identity here: every group is gloo); its construction is handled by
    :func:`cpu_params_pass_cuda_type_checks`.
    """
    global _CPU_APPLIED
    if _CPU_APPLIED:
        return
    from megatron.core.optimizer import clip_grads
    from megatron.core.optimizer import optimizer as mcore_optimizer
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    DistributedOptimizer.get_parameter_state_dp_zero = without_cuda_moves(DistributedOptimizer.get_parameter_state_dp_zero)
    clip_grads.torch = TorchCudaToCpu()
    mcore_optimizer.torch = TorchCudaToCpu()

    def clip_grad_by_total_norm_cpu(parameters, max_norm, total_norm, use_decoupled_grad=False):
        if isinstance(parameters, torch.Tensor):
            parameters = [parameters]
        attr = "decoupled_grad" if use_decoupled_grad else "grad"
        clip_coeff = max_norm / (total_norm + 1.0e-6)
        if clip_coeff < 1.0:
            for param in parameters:
                grad = getattr(param, attr, None)
                if grad is not None:
                    grad.detach().mul_(clip_coeff)

    mcore_optimizer.clip_grad_by_total_norm_fp32 = clip_grad_by_total_norm_cpu

    def l2_norm_cpu(chunk_size, noop_flag, tensor_lists, per_tensor, *args):
        norms = [torch.norm(t) for tensors in tensor_lists for t in tensors]
        return torch.norm(torch.stack(norms)).reshape(1).float(), None

    from megatron.core.utils import local_multi_tensor_l2_norm

    if clip_grads.l2_norm_impl is local_multi_tensor_l2_norm:  # the fallback allocates on "cuda"
        clip_grads.l2_norm_impl = l2_norm_cpu
    _CPU_APPLIED = True


def fit_torch_adam(optimizer) -> None:
    """Make megatron-core's DistributedOptimizer checkpoint torch's Adam/AdamW correctly
    (in place, on each distributed optimizer of `optimizer` that wraps one).

    Without transformer-engine or apex (CPU; GPUs without TE) megatron runs torch's Adam, which
    keeps a step tensor per parameter, created at its first step; the distributed optimizer
    assumes a fused Adam that keeps the step in the param group. Three consequences, fixed here:

    * a checkpoint request (save before the first step, any load into a fresh engine) reads the
      step from the state (``assert len(steps) == 1``): give parameters without state what the
      first step would create (step 0, zero moments); the checkpoint overwrites it on load;
    * a load gives every parameter one shared step tensor, which torch's Adam then increments
      once per parameter (a wrong bias correction from the second step on): untie them;
    * the parameter-state loader copies every state key from the checkpoint, but the
      ``fully_reshardable`` format saves no per-parameter step and ``dp_reshardable`` one from the
      request (0): keep the step the param groups restored;
    * Megatron-FSDP's ``fsdp_dtensor`` format saves each parameter's step as one replicated tensor
      (written by any one DP rank), but a rank whose shard of a parameter is empty never steps it
      (0 there, N on the others): a save first gives every rank the DP group's largest step.
    """
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        if isinstance(opt, DistributedOptimizer) and isinstance(inner, torch.optim.Adam | torch.optim.AdamW):
            _fit_torch_adam(opt, inner)


def _fit_torch_adam(opt, adam: torch.optim.Optimizer) -> None:
    sharded_state_dict, load_state_dict, set_states = (
        opt.sharded_state_dict, opt.load_state_dict, opt._set_main_param_and_optimizer_states)

    def materialized_sharded_state_dict(*args, **kwargs):
        for group in adam.param_groups:
            for param in group["params"]:
                if not adam.state[param]:
                    adam.state[param].update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(param),
                                             exp_avg_sq=torch.zeros_like(param))
        if opt.ddp_config.use_megatron_fsdp and not kwargs.get("is_loading", False):
            _steps_agree_over_dp(adam)
        return sharded_state_dict(*args, **kwargs)

    def untied_load_state_dict(state_dict):
        load_state_dict(state_dict)
        for state in adam.state.values():
            if "step" in state:
                state["step"] = state["step"].clone()

    def set_states_but_step(model_param, tensors):
        group_index, group_order = opt.model_param_group_index_map[model_param]
        main_param = adam.param_groups[group_index]["params"][group_order]
        set_states(model_param, {**tensors, "step": adam.state[main_param]["step"]})  # the groups' step, kept

    opt.sharded_state_dict = materialized_sharded_state_dict
    opt.load_state_dict = untied_load_state_dict
    opt._set_main_param_and_optimizer_states = set_states_but_step


def _steps_agree_over_dp(adam: torch.optim.Optimizer) -> None:
    """Every Adam step tensor of `adam` (a Megatron-FSDP shard's) set to its largest value over the DP x CP
    group, whose ranks hold the same parameters in the same order."""
    from megatron.core import parallel_state

    group = parallel_state.get_data_parallel_group(with_context_parallel=True)
    states = [adam.state[p] for g in adam.param_groups for p in g["params"]]
    device = "cuda" if torch.distributed.get_backend(group) == "nccl" else "cpu"
    steps = torch.stack([state["step"].detach().float().reshape(()) for state in states]).to(device)
    torch.distributed.all_reduce(steps, op=torch.distributed.ReduceOp.MAX, group=group)
    for state, step in zip(states, steps.cpu()):
        state["step"].copy_(step)


def init_sgd_state(torch_optimizer: torch.optim.Optimizer, config=None) -> None:
    """Zero momentum buffers (what SGD's first step would otherwise create lazily); megatron's
    ``init_state_fn`` signature.

    megatron builds the optimizer part of a checkpoint request from existing state; SGD
    has none before its first step and megatron-core ships no init function for it.
    A zero buffer gives the same first step as a lazily created one (buf = grad).
    """
    for group in torch_optimizer.param_groups:
        for param in group["params"]:
            state = torch_optimizer.state[param]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(param.data)


def match_param_groups_without_lr_bounds(optimizer) -> None:
    """Make megatron-core match saved param groups to ``optimizer``'s by their structural keys and
    ``default_config``, without their lr / weight-decay bounds (process-wide, idempotent), as 0.16.1
    did; megarl's scheduler sets those after the load.

    Raises:
        ValueError: two param groups of one optimizer differ only in those bounds (per-group lr
            overrides beyond decoupled_lr, which megarl does not set): they could not be told apart on load.
    """
    from megatron.core.optimizer import distrib_optimizer
    from megatron.core.optimizer import optimizer as mcore_optimizer

    # default_config tells a decoupled_lr group (an override of max_lr / min_lr in 0.19) from the default one
    keys = tuple(k for k in mcore_optimizer.param_group_identifier_keys if k not in _SCHEDULED_BOUNDS)
    keys += ("default_config",) * ("default_config" not in keys)
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        groups = opt.optimizer.param_groups if getattr(opt, "optimizer", None) is not None else []
        identifiers = [tuple(g.get(k, g.get(f"pre_{k}")) for k in keys) for g in groups]
        if len(set(identifiers)) != len(identifiers):
            raise ValueError(f"optimizer param groups that differ only in {_SCHEDULED_BOUNDS} cannot be matched on "
                             f"load: {identifiers}")
    mcore_optimizer.param_group_identifier_keys = keys
    distrib_optimizer.param_group_identifier_keys = keys
