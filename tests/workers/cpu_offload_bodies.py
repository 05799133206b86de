"""Rank bodies for tests/workers/test_optimizer_cpu_offload.py (spawned by dist_utils.run_distributed): Adam
steps of the actor and the critic with Megatron's plain distributed optimizer and with its CPU optimizer
(HybridDeviceOptimizer, verl's keys: optimizer_cpu_offload, optimizer_offload_fraction,
overlap_cpu_optimizer_d2h_h2d, use_precision_aware_optimizer), checkpoints between two steps and resumes."""

from __future__ import annotations

import contextlib

import torch

from dist_optim_bodies import ADAM
from helpers.tiny import actor_rollout_ref_config, critic_config, megatron_node, worker_data
from worker_bodies import _allow_checkpoint_writer_processes, _export, _rank0


def cpu_optimizer(fraction: float) -> dict:
    """`override_optimizer_config` as verl's MoE scripts set it (use_precision_aware_optimizer is a typed key)."""
    return {"optimizer_cpu_offload": True, "optimizer_offload_fraction": fraction, "overlap_cpu_optimizer_d2h_h2d": True}


# name -> (override_optimizer_config, megatron keys); every case: bf16 parameters, the distributed optimizer
CASES = {
    "plain": ({}, {}),
    "cpu_f1": (cpu_optimizer(1.0), {}),
    "cpu_f05": (cpu_optimizer(0.5), {}),
    # megarl's own offload between phases as well (verl's scripts set both)
    "cpu_f05_offload": (cpu_optimizer(0.5), {"param_offload": True, "optimizer_offload": True}),
    "cpu_f1_fully_reshardable": (cpu_optimizer(1.0), {"dist_ckpt_optim_fully_reshardable": True}),
}


def _optim(overrides: dict) -> dict:
    return {**ADAM, "use_precision_aware_optimizer": bool(overrides)}


def _actor(model_path: str, tp: int, case: str):
    from megarl.workers.actor import ActorWorker

    overrides, megatron = CASES[case]
    cfg = actor_rollout_ref_config(
        model_path, megatron_node(tensor_model_parallel_size=tp, use_distributed_optimizer=True, dtype="bfloat16", **megatron),
        optim=_optim(overrides))
    cfg.actor.optim.override_optimizer_config = overrides  # a free-form node the yaml leaves empty
    actor = ActorWorker(cfg, "actor", device="cpu")
    actor.init_model()
    return actor


def _split(actor) -> dict:
    """Elements of this rank's optimizer share stepped by the host sub-optimizers and by the device one,
    and whether each part's state is in memory now (storage bytes > 0) or offloaded."""
    from megatron.core.optimizer.cpu_offloading import HybridDeviceOptimizer

    hdo = actor.engine.optimizer.optimizer
    if not isinstance(hdo, HybridDeviceOptimizer):
        return {}

    def params(opts):
        return [p for opt in opts for group in opt.param_groups for p in group["params"]]

    def state_bytes(opts):
        return [v.untyped_storage().nbytes() for opt in opts for s in opt.state.values()
                for k, v in s.items() if k in ("exp_avg", "exp_avg_sq")]

    def nbytes(tensors):
        return sum(t.numel() * t.element_size() for t in tensors)

    device = [hdo.gpu_optimizer] if hdo.gpu_optimizer is not None else []
    host_params = params(hdo.cpu_optimizers)
    moments = lambda opts: [v for opt in opts for s in opt.state.values() for k, v in s.items()  # noqa: E731
                            if k in ("exp_avg", "exp_avg_sq")]
    return {"host_numel": sum(p.numel() for p in host_params), "device_numel": sum(p.numel() for p in params(device)),
            # what megarl.plan.memory counts: fp32 main params + moments (+ the host gradient copies)
            "host_bytes": nbytes(host_params) + nbytes(moments(hdo.cpu_optimizers))
                          + nbytes(hdo.cpu_copy_map_grad[p] for p in host_params),
            "device_bytes": nbytes(params(device)) + nbytes(moments(device)),
            "largest": max(p.numel() for g in hdo.param_groups for p in g["params"]),
            "host_state_bytes": state_bytes(hdo.cpu_optimizers), "device_state_bytes": state_bytes(device),
            # megarl's exact host gradient buffers (the hybrid optimizer makes rounded ones at its first step)
            "host_grads_exact": all(p in hdo.cpu_copy_map_grad and p.grad is hdo.cpu_copy_map_grad[p]
                                    and p.grad.untyped_storage().nbytes() == p.numel() * 4 for p in host_params)}


def train(model_path: str, batch: dict, tp: int, ckpt_root: str) -> dict:
    """Per case: the initial weights, two steps (a checkpoint after the first), the weights and grad norms."""
    _allow_checkpoint_writer_processes()
    data = worker_data(batch)  # DP=1: every row on every rank
    out = {}
    for case in CASES:
        actor = _actor(model_path, tp, case)
        initial = _rank0(_export(actor))
        built = _split(actor)
        first = actor.update_policy(data)
        split = _split(actor)  # after the update (state made; offloaded again where configured)
        split["host_grads_before_first_step"] = built.get("host_grads_exact")
        actor.save_checkpoint(f"{ckpt_root}/{case}")
        second = actor.update_policy(data)
        out[case] = {"initial": initial, "updated_step2": _rank0(_export(actor)), "split": split,
                     "grad_norm": (first["actor/grad_norm"], second["actor/grad_norm"])}
    return out


def resume(model_path: str, batch: dict, tp: int, ckpt_root: str) -> dict:
    """Per case, a fresh actor loads the checkpoint saved after the first step, then takes the second."""
    data = worker_data(batch)  # DP=1: every row on every rank
    out = {}
    for case in CASES:
        actor = _actor(model_path, tp, case)
        actor.load_checkpoint(f"{ckpt_root}/{case}")
        grad_norm = actor.update_policy(data)["actor/grad_norm"]
        out[case] = {"updated_step2": _rank0(_export(actor)), "grad_norm": grad_norm}
    return out


def critic_steps(model_path: str, batch: dict) -> dict:
    """The critic's values after two Adam steps, plain and with the CPU optimizer at fraction 0.5."""
    from megarl.workers.critic import CriticWorker

    data = worker_data(batch)  # DP=1: every row on every rank
    out = {}
    for case in ("plain", "cpu_f05"):
        overrides, _ = CASES[case]
        cfg = critic_config(model_path, megatron_node(use_distributed_optimizer=True, dtype="bfloat16"),
                            optim=_optim(overrides))
        cfg.optim.override_optimizer_config = overrides
        critic = CriticWorker(cfg, device="cpu")
        critic.init_model()
        before = critic.compute_values(data).batch["values"]
        for _ in range(2):
            critic.update_critic(data)
        out[case] = {"before": before, "after": critic.compute_values(data).batch["values"],
                     "hybrid": type(critic.engine.optimizer.optimizer).__name__}
    return out


class GroupStepAdamW(torch.optim.AdamW):
    """torch's AdamW counting its steps as TransformerEngine's FusedAdam does (the GPU part's optimizer on a GPU
    machine): one count per param group, ``group["step"]``, which its update reads; the per-parameter step
    megatron's checkpoint code reads mirrors it."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            group["step"] = group.get("step", 0) + 1
            t, (beta1, beta2), lr = group["step"], group["betas"], group["lr"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "exp_avg" not in state:
                    state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
                state["step"] = torch.tensor(float(t))
                p.mul_(1 - lr * group["weight_decay"])
                state["exp_avg"].lerp_(p.grad, 1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                denom = (state["exp_avg_sq"] / (1 - beta2 ** t)).sqrt_().add_(group["eps"])
                p.addcdiv_(state["exp_avg"], denom, value=-lr / (1 - beta1 ** t))


@contextlib.contextmanager
def device_adam_counting_in_groups():
    """Megatron's device Adam class (the hybrid optimizer's GPU part) is :class:`GroupStepAdamW` in the block."""
    import megatron.core.optimizer as mcore_optimizer

    original, mcore_optimizer.Adam = mcore_optimizer.Adam, GroupStepAdamW
    try:
        yield
    finally:
        mcore_optimizer.Adam = original


def group_step_resume(model_path: str, batch: dict, ckpt_dir: str) -> dict:
    """Fraction 0.5 with a device Adam that counts steps per group: three steps (saved after the first), and a
    fresh actor that loads the checkpoint and takes the second and third; the third step's weights of each."""
    _allow_checkpoint_writer_processes()
    data = worker_data(batch)
    with device_adam_counting_in_groups():
        actor = _actor(model_path, 1, "cpu_f05")
        assert isinstance(actor.engine.optimizer.optimizer.gpu_optimizer, GroupStepAdamW)
        actor.update_policy(data)
        actor.save_checkpoint(ckpt_dir)
        for _ in range(2):
            actor.update_policy(data)
        out = {"uninterrupted": _export(actor)}
        actor = _actor(model_path, 1, "cpu_f05")
        actor.load_checkpoint(ckpt_dir)
        for _ in range(2):
            actor.update_policy(data)
        out["resumed"] = _export(actor)
        out["device_steps"] = [g["step"] for g in actor.engine.optimizer.optimizer.gpu_optimizer.param_groups]
    return out
