"""`python -m megarl.plan [--gpu-memory-gib N] key=value ...`: the launch plan, before any worker.

Composes and validates the config exactly as `python -m megarl.main_ppo` does (same Hydra
entry, overrides and checks, but not the local-machine preflight: the plan is for the
cluster of trainer.nnodes x trainer.n_gpus_per_node), then prints where each role goes and
the memory estimate per role and phase. Exit 0: the plan fits; 2: a bad config or a plan
that does not fit (each problem names the keys to change).
"""

from __future__ import annotations

import argparse
import sys

from megarl.config import ConfigError, check_override_keys, check_schema, resolve_config, validate_config
from megarl.config.load import load_config

EXIT_REFUSED = 2


def plan_text(overrides: list[str]) -> tuple[str, bool]:
    """(the plan as text, whether it fits). Raises ConfigError for a bad config."""
    from megarl.config.typed import typed_config
    from megarl.data.demo import ensure_demo_assets
    from megarl.plan.build import build_plan, gpu_memory_gib
    from megarl.plan.report import format_plan

    issues = check_override_keys(overrides)
    if issues:
        raise ConfigError(issues)
    cfg = load_config(overrides)
    issues = check_schema(cfg)
    if issues:
        raise ConfigError(issues)
    ensure_demo_assets(cfg)
    validate_config(cfg)
    resolved = resolve_config(cfg)
    trainer = typed_config(resolved).trainer
    plan = build_plan(resolved, gpu_memory_gib(trainer.memory_plan, trainer.device))
    return format_plan(plan), not plan.issues


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m megarl.plan", description=__doc__.splitlines()[0])
    parser.add_argument("--gpu-memory-gib", type=float, default=None,
                        help="memory of one GPU (= trainer.memory_plan.gpu_memory_gib; default: that key)")
    parser.add_argument("overrides", nargs="*", help="config overrides, as for megarl.main_ppo")
    args, rest = parser.parse_known_args(argv)
    unknown = [a for a in rest if not a.startswith("--config-name")]  # main_ppo's own flag is accepted
    if unknown:
        parser.error(f"unrecognised arguments: {' '.join(unknown)}")
    if args.gpu_memory_gib is not None:
        args.overrides.append(f"trainer.memory_plan.gpu_memory_gib={args.gpu_memory_gib}")
    try:
        text, fits = plan_text(args.overrides)
    except (ConfigError, ValueError) as error:
        print(f"megarl: {error}", file=sys.stderr)
        return EXIT_REFUSED
    print(text)
    return 0 if fits else EXIT_REFUSED


if __name__ == "__main__":
    sys.exit(main())
