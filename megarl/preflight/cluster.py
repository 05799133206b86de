"""Preflight of the local machine: without RAY_ADDRESS, `run_ppo` starts a one-node Ray
here, so the requested slots must fit this machine (else placement waits, then fails).
The slots are the trainer's (trainer.n_gpus_per_node) plus, with trainer.v1.trainer_mode=separate_async,
the standalone engines' (actor_rollout_ref.rollout.nnodes x n_gpus_per_node; 0 nodes in the other modes)."""

from __future__ import annotations

import os

from megarl.config.errors import Issue
from megarl.config.schema.root import MegaRLConfig

CPU_PER_CPU_RANK = 0.5  # what megarl.trainer reserves per rank when trainer.device=cpu
_ENGINES = "actor_rollout_ref.rollout"


def local_cluster_issues(cfg: MegaRLConfig) -> list[Issue]:
    """Without RAY_ADDRESS, run_ppo starts a one-node Ray on this machine: the requested
    slots must fit it, or placement would wait (minutes) and fail. A cluster named by
    RAY_ADDRESS is not checked here (its nodes are not visible before Ray starts)."""
    if os.environ.get("RAY_ADDRESS"):
        return []
    rollout = cfg.actor_rollout_ref.rollout
    for key, nodes in (("trainer.nnodes", cfg.trainer.nnodes), (f"{_ENGINES}.nnodes", rollout.nnodes)):
        if nodes > 1:
            return [Issue(key, nodes, "a local Ray (RAY_ADDRESS is not set) has one node",
                          f"start a Ray cluster (launch/ray_*.sh) and export RAY_ADDRESS, or set {key}=1")]
    import torch

    device = cfg.trainer.device
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device == "cuda" or (device == "auto" and gpus > 0):
        return _slots_issue(cfg, gpus, 1.0, f"this machine has {gpus} CUDA GPU(s) (trainer.device={device})",
                            "" if gpus else ", or trainer.device=cpu")
    num_cpus = cfg.ray_kwargs.ray_init.num_cpus
    cpus = num_cpus or os.cpu_count() or 1
    source = "ray_kwargs.ray_init.num_cpus" if num_cpus else "this machine"
    return _slots_issue(cfg, cpus, CPU_PER_CPU_RANK, f"{{ranks}} CPU ranks reserve {{need:g}} CPUs ({CPU_PER_CPU_RANK} "
                        f"each) but {source} has {cpus}", " or raise ray_kwargs.ray_init.num_cpus")


def _slots_issue(cfg: MegaRLConfig, capacity: float, per_slot: float, problem: str, fix_tail: str) -> list[Issue]:
    """The trainer's slots plus the engines' at ``per_slot`` each against ``capacity``; the issue names
    the engines' key when the trainer alone fits (``problem`` may use ``{ranks}`` and ``{need}``)."""
    trainer = cfg.trainer.n_gpus_per_node
    engines = cfg.actor_rollout_ref.rollout.nnodes * cfg.actor_rollout_ref.rollout.n_gpus_per_node
    need = (trainer + engines) * per_slot
    if need <= capacity:
        return []
    problem = problem.format(ranks=trainer + engines, need=need)
    fits = int(capacity / per_slot)
    if engines and trainer * per_slot < capacity:
        key, value, fits = f"{_ENGINES}.n_gpus_per_node", engines, fits - trainer
        problem += f" (trainer.n_gpus_per_node={trainer} + the separate_async engines' {engines})"
    else:
        key, value, fits = "trainer.n_gpus_per_node", trainer, fits - engines
    return [Issue(key, value, problem, f"set {key} <= {max(fits, 0)}{fix_tail}")]
