"""ConfigError and the Issue it collects: every bad key is reported in one error."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_NO_VALUE = object()


@dataclass(frozen=True)
class Issue:
    """One problem with one config key.

    key: full dotted key (`actor_rollout_ref.rollout.n`); value: its value as given
    (omitted from the message when `_NO_VALUE`); problem: what is wrong; fix: what to do.
    """

    key: str
    value: Any
    problem: str
    fix: str

    def format(self) -> str:
        shown = "" if self.value is _NO_VALUE else f" = {self.value!r}"
        return f"{self.key}{shown}: {self.problem}\n      fix: {self.fix}"


class ConfigError(ValueError):
    """Raised by `validate_config`; `issues` lists every problem found (not just the first)."""

    def __init__(self, issues: list[Issue]):
        self.issues = list(issues)
        n = len(self.issues)
        lines = [f"invalid megarl config ({n} problem{'s' if n != 1 else ''}):"]
        lines += [f"  - {issue.format()}" for issue in self.issues]
        super().__init__("\n".join(lines))


def no_value() -> Any:
    """Sentinel for `Issue.value` when the problem is about a key, not a value (e.g. unknown key)."""
    return _NO_VALUE
