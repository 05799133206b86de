"""Assertion helpers for the config tests (imported as a top-level module)."""

from __future__ import annotations

from omegaconf import DictConfig

from megarl.config import collect_issues


def issue_for(cfg: DictConfig, key: str, *words: str):
    """The issue reported for `key`; its text must contain each of `words`."""
    issues = collect_issues(cfg)
    found = [i for i in issues if i.key == key]
    listing = "\n".join(i.format() for i in issues)
    assert found, f"no issue for {key}; got:\n{listing}"
    text = "\n".join(i.format() for i in found)
    for word in words:
        assert word in text, f"{word!r} not in:\n{text}"
    return found[0]


def no_issues(cfg: DictConfig) -> None:
    issues = collect_issues(cfg)
    assert not issues, "\n".join(i.format() for i in issues)
