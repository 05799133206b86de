"""Entry point: `python -m megarl.main_ppo --config-name=ppo_megatron_trainer key=value ...`.

`--dry-run` (optionally with `--gpu-memory-gib N`) prints the launch plan of `python -m megarl.plan`
(placement, memory per role and phase) and starts nothing.

check override syntax and keys -> compose (Hydra) -> check keys and types -> build the
demo assets the config points at -> validate everything (layouts against each model's
config.json, batch sizes, files) -> the memory plan (megarl.plan.gate: a GPU run with a phase
that does not fit is refused unless trainer.memory_plan.enforce=false) -> read it into the typed
config (`MegaRLConfig`, what the trainer, workers and algorithms receive) -> preflight (load the
tokenizer, datasets and reward function as the trainer will) -> print the typed config -> run the
trainer (Ray starts here). A bad config or bad data exits with code 2 and a message naming each bad key, file
and row and the fix; no traceback. A failure after that (a locked run directory, a damaged
checkpoint, a reward function error, a full disk, a worker error) is one message too,
naming the phase, step, worker or file and the fix, with the exit code of
megarl.trainer.failures (3-7, 1 for the unforeseen) and the tracebacks in a log file.
"""

from __future__ import annotations

import os
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from megarl.config import (
    CONFIG_DIR,
    CONFIG_NAME,
    ConfigError,
    Issue,
    MegaRLConfig,
    check_override_keys,
    check_schema,
    resolve_config,
    validate_config,
)
from megarl.config.compose import finish_compose
from megarl.config.config_options import take_config_options
from megarl.config.demo_profile import demo_banner
from megarl.config.errors import no_value
from megarl.config.rules.engines import attention_notice
from megarl.config.read import to_dict, typed_of_resolved
from megarl.config.verl_compat.check import compat_notices
from megarl.plan.gate import memory_gate
from megarl.preflight import RUNTIME_RULES, preflight
from megarl.compat.megatron_core.fallback_warnings import fallback_note
from megarl.compat.omegaconf_yaml import apply_c_yaml_loader
from megarl.utils.signals import EXIT_SIGTERM, exit_code_of, exit_on_sigterm

EXIT_BAD_CONFIG = 2


def _fail(error: ValueError) -> None:
    print(f"megarl: {error}", file=sys.stderr)
    sys.exit(EXIT_BAD_CONFIG)


def exit_with(failure) -> None:
    """Print a ``megarl.trainer.failures.RunFailure`` and exit with its code."""
    print(failure.message(), file=sys.stderr, flush=True)
    sys.exit(failure.code)


def prepare(cfg: DictConfig) -> MegaRLConfig:
    """Schema check, demo assets, full validation, the memory plan, preflight; returns the run's
    typed config.

    Everything a user can get wrong is checked here, before Ray or any worker starts;
    raises ConfigError.
    """
    from megarl.data.demo import ensure_demo_assets  # torch, tensordict: seconds, so only here

    issues = check_schema(cfg)
    if issues:
        raise ConfigError(issues)
    try:
        ensure_demo_assets(cfg)
    except ValueError as error:  # a demo path the builder does not know; names the key
        raise ConfigError([Issue("demo assets", no_value(), str(error), "point the key at your own file or at a demo asset")]) from error
    validate_config(cfg, RUNTIME_RULES)
    for notice in [*compat_notices(cfg), attention_notice(cfg)]:
        if notice:
            print(f"megarl: {notice}", flush=True)
    resolved = resolve_config(cfg)
    typed = typed_of_resolved(resolved)
    refused = memory_gate(resolved, typed)
    try:
        preflight(typed)
    except ConfigError as error:  # every problem at once
        raise ConfigError(refused + error.issues) from None
    if refused:
        raise ConfigError(refused)
    return typed


@hydra.main(config_path=CONFIG_DIR, config_name=CONFIG_NAME, version_base="1.3")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    try:
        applied = finish_compose(cfg, list(HydraConfig.get().overrides.task))
        if applied:
            print(demo_banner(applied), flush=True)
        typed = prepare(cfg)
    except ConfigError as error:
        _fail(error)
    # The keys megarl implements, resolved (verl's other keys are at their defaults or refused).
    print(OmegaConf.to_yaml(OmegaConf.create(to_dict(typed))), flush=True)
    note = fallback_note()
    if note:
        print(note, flush=True)
    from megarl.trainer import run_ppo
    from megarl.trainer.failures import EXIT_INTERRUPTED, FailureContext, explain, interrupted

    try:
        run_ppo(typed)
    except Exception as error:
        context = getattr(error, "megarl_context", None) or FailureContext(run_dir=typed.trainer.default_local_dir)
        exit_with(explain(error, context))
    except (KeyboardInterrupt, SystemExit) as stop:  # Ctrl-C or SIGTERM, after the cleanup: one line, no traceback
        code = EXIT_INTERRUPTED if isinstance(stop, KeyboardInterrupt) else exit_code_of(stop.code)
        if code not in (EXIT_INTERRUPTED, EXIT_SIGTERM):
            raise
        context = getattr(stop, "megarl_context", None) or FailureContext(run_dir=typed.trainer.default_local_dir)
        print(interrupted(code, context), file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(code)  # the cleanup ran; Ray's exit hooks would wait on a cluster that may be gone


def cli() -> None:
    exit_on_sigterm()  # SIGTERM (scancel, a time limit, torchrun) unwinds like Ctrl-C, then exit code 143
    if "--dry-run" in sys.argv[1:]:  # the launch plan only (megarl.plan), nothing starts
        from megarl.plan.__main__ import main as plan_main

        sys.exit(plan_main([a for a in sys.argv[1:] if a != "--dry-run"]))
    apply_c_yaml_loader()  # Hydra's compose below reads the yaml files through OmegaConf's loader
    sys.argv[1:], issues = take_config_options(sys.argv[1:])  # Hydra then composes megarl's own config
    issues += check_override_keys(sys.argv[1:])
    if issues:
        _fail(ConfigError(issues))
    main()


if __name__ == "__main__":  # needed: Megatron's async checkpoint writer spawns processes
    cli()
