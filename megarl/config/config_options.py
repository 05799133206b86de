"""verl's config-selection options on megarl's command lines (`main_ppo`, `--dry-run`, `megarl.plan`).

verl's Megatron scripts pass `--config-path=config --config-name=ppo_megatron_trainer.yaml`
(also `./config`, `-cp`/`-cn`, with or without `.yaml`); the relative path is verl's own
verl/trainer/config, which holds verl's defaults. megarl's yaml holds those defaults, so such a
path and name select megarl's config. Any other directory or config name would be a config megarl
does not read: refused by option, not ignored.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from megarl.config.errors import Issue
from megarl.config.files import CONFIG_DIR, CONFIG_NAME

PATH_OPTIONS = ("--config-path", "-cp")
NAME_OPTIONS = ("--config-name", "-cn")


def _is_verl_config_dir(path: str) -> bool:
    """`config` / `./config` (relative, as verl scripts pass it), a path ending in
    verl/trainer/config, or megarl's own config dir."""
    norm = os.path.normpath(path)
    return norm == "config" or norm.endswith(os.path.join("verl", "trainer", "config")) or (
        os.path.isabs(norm) and norm == os.path.normpath(CONFIG_DIR))


def _option_issue(option: str, value: str) -> Issue | None:
    if option in PATH_OPTIONS and not _is_verl_config_dir(value):
        return Issue(option, value, "megarl composes its own config (verl's keys and defaults); a config directory "
                     "of your own is not read", "drop the option (or pass --config-path=config as verl's scripts do) "
                     "and give your settings as key=value overrides")
    name = value[:-len(".yaml")] if value.endswith(".yaml") else value
    if option in NAME_OPTIONS and name != CONFIG_NAME:
        return Issue(option, value, f"megarl has one trainer config, {CONFIG_NAME} (verl's Megatron trainer config); "
                     f"{name!r} is not it", f"pass --config-name={CONFIG_NAME} or drop the option")
    return None


def take_config_options(argv: Sequence[str]) -> tuple[list[str], list[Issue]]:
    """`argv` without its `--config-path` / `--config-name` options (`--opt=v`, `--opt v`, `-cp v`,
    `-cn v`), and an issue for each that names a config other than megarl's. With them removed the
    caller composes megarl's own config (megarl.config.files.CONFIG_DIR / CONFIG_NAME)."""
    rest: list[str] = []
    issues: list[Issue] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        option, eq, value = arg.partition("=")
        if option in PATH_OPTIONS + NAME_OPTIONS:
            if not eq:
                if i + 1 >= len(argv):
                    issues.append(Issue(option, "", "has no value", f"write {option}=VALUE"))
                    break
                value = argv[i + 1]
                i += 1
            issue = _option_issue(option, value.strip("'\""))
            if issue is not None:
                issues.append(issue)
        else:
            rest.append(arg)
        i += 1
    return rest, issues
