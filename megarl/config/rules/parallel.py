"""Parallel-layout rules: each role's megatron layout and the rollout's vLLM TP against the
world size (the arithmetic is megarl.parallel.layout's), and what some layouts need."""

from __future__ import annotations

import os
from collections.abc import Iterator

from megarl.config.errors import Issue
from megarl.config.rules.roles import Role, active_roles, role_layout
from megarl.config.rules.view import View, needs_files
from megarl.parallel.layout import MEGATRON_KEYS, ParallelLayout


_WORLD_NAME = "the world size = trainer.nnodes x trainer.n_gpus_per_node"


def layout(v: View, role: Role) -> Iterator[Issue]:
    """The role's megatron layout against the world: one issue per rule it breaks."""
    m = role.megatron
    parallel = role_layout(v, role)
    fixes = {
        "tp": f"choose {m}.tensor/pipeline/context_parallel_size whose product divides {parallel.world_size}",
        "ep": f"choose {m}.expert_model_parallel_size and expert_tensor_parallel_size whose product divides {parallel.world_size // parallel.pp}",
        "vpp": f"set {m}.virtual_pipeline_model_parallel_size=null or raise {m}.pipeline_model_parallel_size",
    }
    for problem in parallel.problems(world_name=_WORLD_NAME):
        key = f"{m}.{MEGATRON_KEYS[problem.size]}"
        yield Issue(key, v.get(key), problem.message, fixes[problem.size])


@needs_files("Megatron dist checkpoints (*.megatron.dist_checkpointing_path)")
def dist_checkpoint(v: View, role: Role) -> Iterator[Issue]:
    m = role.megatron
    if not v.get(f"{m}.use_dist_checkpointing"):
        return
    key = f"{m}.dist_checkpointing_path"
    path = v.path(key)
    if path is None or not os.path.isdir(path):
        yield Issue(
            key, v.get(key),
            "use_dist_checkpointing is true but this is not an existing directory",
            f"point {key} at a Megatron dist checkpoint, or set {m}.use_dist_checkpointing=false",
        )


def rollout_layout(v: View) -> Iterator[Issue]:
    key = "actor_rollout_ref.rollout.tensor_model_parallel_size"
    tp = v.get(key)
    if ParallelLayout(world_size=v.world_size(), tp=tp).problems():  # its replicas do not tile the world
        yield Issue(key, tp, f"vLLM TP must divide {_WORLD_NAME} = {v.world_size()}", f"choose {key} dividing {v.world_size()}")


ROLE_RULES = (layout, dist_checkpoint)


def run_role_rules(v: View) -> Iterator:
    """(rule, role) pairs for every active role."""
    for role in active_roles(v):
        for rule in ROLE_RULES:
            yield rule, role


RULES = (rollout_layout,)
