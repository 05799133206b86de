"""Preflight of the local machine: without RAY_ADDRESS, `run_ppo` starts a one-node Ray
here, so the requested slots must fit this machine (else placement waits, then fails)."""

from __future__ import annotations

import os

from megarl.config.errors import Issue
from megarl.config.schema.root import MegaRLConfig

CPU_PER_CPU_RANK = 0.5  # what megarl.trainer reserves per rank when trainer.device=cpu


def local_cluster_issues(cfg: MegaRLConfig) -> list[Issue]:
    """Without RAY_ADDRESS, run_ppo starts a one-node Ray on this machine: the requested
    slots must fit it, or placement would wait (minutes) and fail. A cluster named by
    RAY_ADDRESS is not checked here (its nodes are not visible before Ray starts)."""
    if os.environ.get("RAY_ADDRESS"):
        return []
    nnodes, per_node = cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node
    if nnodes > 1:
        return [Issue("trainer.nnodes", nnodes, "a local Ray (RAY_ADDRESS is not set) has one node",
                      "start a Ray cluster (launch/ray_*.sh) and export RAY_ADDRESS, or set trainer.nnodes=1")]
    import torch

    device = cfg.trainer.device
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device == "cuda" or (device == "auto" and gpus > 0):
        if per_node > gpus:
            return [Issue("trainer.n_gpus_per_node", per_node, f"this machine has {gpus} CUDA GPU(s) (trainer.device={device})",
                          f"set trainer.n_gpus_per_node <= {gpus}" + ("" if gpus else ", or trainer.device=cpu"))]
        return []
    num_cpus = cfg.ray_kwargs.ray_init.num_cpus
    cpus = num_cpus or os.cpu_count() or 1
    need = per_node * CPU_PER_CPU_RANK
    if need > cpus:
        source = "ray_kwargs.ray_init.num_cpus" if num_cpus else "this machine"
        return [Issue("trainer.n_gpus_per_node", per_node,
                      f"{per_node} CPU ranks reserve {need:g} CPUs ({CPU_PER_CPU_RANK} each) but {source} has {cpus}",
                      f"set trainer.n_gpus_per_node <= {int(cpus / CPU_PER_CPU_RANK)} or raise ray_kwargs.ray_init.num_cpus")]
    return []
