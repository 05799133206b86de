"""Check command-line override keys before Hydra composes.

Hydra rejects `a.b=c` for a key that is not in the yaml with its own terse message;
this gives the same did-you-mean as `validate_config` instead.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

from megarl.config.check_keys import schema_type_at, unknown_key_issue
from megarl.config.errors import Issue, no_value
from megarl.config.files import CONFIG_YAML
from megarl.config.schema.root import MegaRLConfig


@functools.cache
def _parser():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def _syntax_issue(arg: str) -> Issue | None:
    """An issue when Hydra's override grammar cannot parse `arg` (else Hydra exits with its own text)."""
    from hydra.errors import OverrideParseException

    try:
        _parser().parse_overrides([arg])
    except OverrideParseException as exc:
        key = arg.split("=", 1)[0].strip() or arg
        why = str(exc).splitlines()[0]
        return Issue(
            key, no_value(), f"cannot parse the command-line override {arg!r} ({why})",
            "write key=value; lists as key=[a,b]; quote values with spaces or special characters, e.g. 'key=\"a b\"'",
        )
    return None


def check_override_keys(args: Sequence[str]) -> list[Issue]:
    """Issues for overrides Hydra cannot parse and plain `key=value` overrides whose key is
    not in the schema.

    Skipped: options (`-x`, `--x`), additions/deletions (`+k=`, `~k`; validate_config
    checks the composed result), `hydra.*` keys and config-group overrides.
    """
    issues = []
    for arg in args:
        if arg.startswith("-"):
            continue
        syntax = _syntax_issue(arg)
        if syntax is not None:
            issues.append(syntax)
            continue
        if arg.startswith("+") and not arg.startswith("++") and "=" in arg:
            key = arg[1:].split("=", 1)[0].strip()
            tp = schema_type_at(MegaRLConfig, key)
            if tp is not None and tp is not Any:  # a schema key (not inside a free-form mapping)
                issues.append(Issue(key, no_value(), f"is already in the config; '+' only adds new keys ({arg!r})", f"drop the '+': {arg[1:]}"))
            continue
        if arg.startswith(("+", "~")) or "=" not in arg:
            continue
        key = arg.split("=", 1)[0].strip()
        if key.startswith("hydra.") or key == "hydra" or "/" in key or "@" in key:
            continue
        tp = schema_type_at(MegaRLConfig, key)
        if tp is None:
            issues.append(unknown_key_issue(MegaRLConfig, key))
        elif tp is Any and not _in_yaml(key):  # inside a free-form mapping: Hydra adds a key only with '+'
            issues.append(Issue(key, no_value(), f"not in the config yet: Hydra adds a key only with '+' ({arg!r})",
                                f"write +{arg}"))
    return issues


@functools.cache
def _yaml() -> DictConfig:
    return OmegaConf.load(CONFIG_YAML)


def _in_yaml(key: str) -> bool:
    """Whether the project yaml has ``key`` (nothing resolved)."""
    node: Any = _yaml()
    for part in key.split("."):
        if not isinstance(node, DictConfig) or part not in node.keys():
            return False
        node = node._get_node(part)
    return True
