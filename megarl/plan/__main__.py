"""`python -m megarl.plan [--gpu-memory-gib N] key=value ...`: the launch plan, before any worker.

Composes and validates the config as `python -m megarl.main_ppo` does (same Hydra entry,
overrides and checks) for the cluster of trainer.nnodes x trainer.n_gpus_per_node, from
wherever the job is submitted: no local-machine preflight; each model needs only its
config.json (checks of data files, weights and tokenizers are skipped, and the plan says so);
with trainer.device=cuda on a machine without a GPU, settings that need GPU packages are
judged against the GPU stack megarl ships (megarl.plan.stack), not the local packages. Then
prints where each role goes and the memory estimate per role and phase. Exit 0: the plan
fits; 2: a bad config or a plan that does not fit (each problem names the keys to change).
"""

from __future__ import annotations

import argparse
import sys

from hydra.errors import HydraException

from megarl.config import ConfigError, Issue, check_override_keys, check_schema, load_config, resolve_config, validate_config
from megarl.config.config_options import take_config_options
from megarl.config.rules.engines import attention_notice
from megarl.config.rules.view import FILE_CHECKS, has_module
from megarl.plan.stack import GPU_LOCK, in_gpu_stack
from megarl.preflight import RUNTIME_RULES

EXIT_REFUSED = 2


def plan_text(overrides: list[str]) -> tuple[str, list[Issue]]:
    """(the plan as text, its issues: empty when it fits). Raises ConfigError for a bad config."""
    from megarl.config.read import typed_of_resolved
    from megarl.data.demo import ensure_demo_assets
    from megarl.plan.build import build_plan, gpu_memory_gib, host_memory_gib
    from megarl.plan.report import format_plan

    issues = check_override_keys(overrides)
    if issues:
        raise ConfigError(issues)
    cfg = load_config(overrides)
    issues = check_schema(cfg)
    if issues:
        raise ConfigError(issues)
    ensure_demo_assets(cfg)
    notes = ["checks skipped (a plan needs only each model's config.json): " + ", ".join(FILE_CHECKS)]
    installed = has_module
    if cfg.trainer.device == "cuda" and not _local_gpu():
        installed = in_gpu_stack
        notes.append(f"GPU packages judged against the stack megarl ships ({GPU_LOCK.name}; this machine has no GPU)")
    validate_config(cfg, RUNTIME_RULES, installed=installed, files=False)
    notes += [n for n in [attention_notice(cfg, installed)] if n]
    resolved = resolve_config(cfg)
    typed = typed_of_resolved(resolved)
    trainer = typed.trainer
    plan = build_plan(resolved, gpu_memory_gib(trainer.memory_plan, trainer.device),
                      host_memory_gib(trainer.memory_plan, trainer.device), typed)
    return format_plan(plan, notes=notes), plan.issues


def _local_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def main(argv: list[str] | None = None) -> int:
    argv, option_issues = take_config_options(sys.argv[1:] if argv is None else argv)
    if option_issues:
        print(f"megarl: {ConfigError(option_issues)}", file=sys.stderr)
        return EXIT_REFUSED
    parser = argparse.ArgumentParser(prog="python -m megarl.plan", description=__doc__.splitlines()[0])
    parser.add_argument("--gpu-memory-gib", type=float, default=None,
                        help="memory of one GPU (= trainer.memory_plan.gpu_memory_gib; default: that key)")
    parser.add_argument("overrides", nargs="*", help="config overrides, as for megarl.main_ppo")
    args = parser.parse_args(argv)
    if args.gpu_memory_gib is not None:
        args.overrides.append(f"trainer.memory_plan.gpu_memory_gib={args.gpu_memory_gib}")
    try:
        text, issues = plan_text(args.overrides)
    except (ConfigError, ValueError, HydraException) as error:
        print(f"megarl: {error}", file=sys.stderr)
        return EXIT_REFUSED
    print(text)
    return EXIT_REFUSED if issues else 0


if __name__ == "__main__":
    sys.exit(main())
