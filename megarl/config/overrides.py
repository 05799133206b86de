"""Check command-line override keys before Hydra composes.

Hydra rejects `a.b=c` for a key that is not in the yaml with its own terse message;
this gives the same did-you-mean as `validate_config` instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from megarl.config.errors import Issue
from megarl.config.schema import MegaRLConfig
from megarl.config.walk import schema_type_at, unknown_key_issue


def check_override_keys(args: Sequence[str]) -> list[Issue]:
    """Issues for plain `key=value` overrides whose key is not in the schema.

    Skipped: options (`-x`, `--x`), additions/deletions (`+k=`, `~k`; validate_config
    checks the composed result), `hydra.*` keys and config-group overrides.
    """
    issues = []
    for arg in args:
        if arg.startswith(("-", "+", "~")) or "=" not in arg:
            continue
        key = arg.split("=", 1)[0].strip()
        if key.startswith("hydra.") or key == "hydra" or "/" in key or "@" in key:
            continue
        if schema_type_at(MegaRLConfig, key) is None:
            issues.append(unknown_key_issue(MegaRLConfig, key))
    return issues
