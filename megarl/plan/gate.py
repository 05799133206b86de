"""The plan as `main_ppo`'s gate: built in `prepare()` before Ray or any worker starts.

With ``trainer.memory_plan.enforce`` (default) and a GPU run, a phase that does not fit one GPU
is a config problem (exit 2, naming the keys to change); otherwise the plan's problems are
printed and the run starts. ``trainer.device=cpu`` runs have no GPU memory to plan: the plan is
reported, never enforced.
"""

from __future__ import annotations

import dataclasses

from omegaconf import DictConfig

from megarl.config.errors import Issue
from megarl.config.schema import MegaRLConfig
from megarl.plan.build import GIB, build_plan, gpu_memory_gib, host_memory_gib

__all__ = ["memory_gate"]

SKIP_HINT = "; or trainer.memory_plan.enforce=false to start anyway"


def memory_gate(cfg: DictConfig, typed: MegaRLConfig) -> list[Issue]:
    """The plan of the resolved, validated ``cfg`` (``typed``: its typed form) in one line (and its problems)
    on stdout; the problems that refuse the run (empty when it fits or is not enforced)."""
    trainer = typed.trainer
    enforce, device = trainer.memory_plan.enforce, trainer.device
    plan = build_plan(cfg, gpu_memory_gib(trainer.memory_plan, device), host_memory_gib(trainer.memory_plan, device), typed)
    name, peak = max(((n, p.total) for n, p in plan.phases.items()), key=lambda item: item[1])
    verdict = "fits" if not plan.issues else "does NOT fit"
    print(f"megarl: memory plan {verdict}: peak {peak / GIB:.1f} of {plan.gpu_bytes / GIB:g} GiB per GPU in phase "
          f"{name} (each phase's terms: python -m megarl.plan with the same overrides)", flush=True)
    if not plan.issues:
        return []
    if enforce and device != "cpu":
        return [dataclasses.replace(issue, fix=issue.fix + SKIP_HINT) for issue in plan.issues]
    why = "trainer.device=cpu" if device == "cpu" else "trainer.memory_plan.enforce=false"
    print(f"megarl: starting anyway ({why}):\n" + "\n".join("  - " + issue.format() for issue in plan.issues), flush=True)
    return []
