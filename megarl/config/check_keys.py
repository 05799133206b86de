"""Check a config tree against the schema dataclasses: unknown/missing keys, types, ranges.

Returns the issues found and the set of keys whose values are unusable, so cross-key
rules can skip what is already reported.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import types
import typing
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from megarl.config.errors import Issue, no_value
from megarl.config.files import CONFIG_YAML
from megarl.config.schema.field import all_schema_paths, schema_fields
from megarl.config.verl_compat.accepted_keys import rule_for
from megarl.config.verl_compat.unsupported import UNSUPPORTED_VERL_KEYS


def schema_type_at(root: type, dotted: str) -> Any | None:
    """Type of the schema field at `dotted` (a dataclass for a section), `Any` inside a free-form
    mapping or a verl key megarl accepts (verl_compat.accepted_keys), None if unknown."""
    if rule_for(dotted) is not None:
        return Any
    tp: Any = root
    for part in dotted.split("."):
        if tp is dict or typing.get_origin(tp) is dict:
            return Any  # free-form mapping (override_config, engine_kwargs.vllm, ...): any sub-key
        if not dataclasses.is_dataclass(tp):
            return None
        field = schema_fields(tp).get(part)
        if field is None:
            return None
        tp = field[0]
    return tp


def unknown_key_issue(root: type, key: str) -> Issue:
    """An unknown-key issue with the best hint: an unsupported-verl-key reason or a did-you-mean."""
    for suffix, reason in UNSUPPORTED_VERL_KEYS.items():
        if f".{suffix}." in f".{key}.":  # suffix matches whole dotted parts anywhere in key
            return Issue(key, no_value(), f"not accepted: {reason}", f"remove {key}")
    parent, _, leaf = key.rpartition(".")
    paths = all_schema_paths(root)
    siblings = [p.rpartition(".")[2] for p in paths if p.rpartition(".")[0] == parent]
    close = [f"{parent}.{s}" if parent else s for s in difflib.get_close_matches(leaf, siblings, n=3, cutoff=0.6)]
    # The same leaf name somewhere else in the tree (e.g. actor.n -> rollout.n).
    close += [p for p in paths if p.rpartition(".")[2] == leaf and p not in close]
    if not close:
        close = difflib.get_close_matches(key, paths, n=3, cutoff=0.75)
    named = [p if "." in p else f"the top-level {p}" for p in close]  # not "did you mean model_engine?" for a.b.model_engine
    fix = f"did you mean {' or '.join(named)}?" if close else f"remove {key} (see megarl/configs/megatron/ppo_megatron_trainer.yaml for valid keys)"
    return Issue(key, no_value(), "unknown key", fix)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict or tp is dict:
        return "mapping"
    if origin is typing.Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    return {float: "number", int: "integer", bool: "boolean (true/false)", str: "string"}.get(tp, getattr(tp, "__name__", str(tp)))


def _matches(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in typing.get_args(tp))
    if origin is typing.Literal:
        return any(type(value) is type(a) and value == a for a in typing.get_args(tp))
    if origin is list:
        (item,) = typing.get_args(tp)
        return isinstance(value, list) and all(_matches(v, item) for v in value)
    if origin is dict or tp is dict:
        return isinstance(value, dict)
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    return isinstance(value, tp)


@functools.cache
def _yaml_defaults() -> DictConfig | None:
    try:
        return OmegaConf.load(CONFIG_YAML)
    except Exception:
        return None


def _default_example(key: str, tp: Any) -> str | None:
    """The yaml default of `key` as a command-line value, if it is a plain value of type `tp`."""
    defaults = _yaml_defaults()
    if defaults is None:
        return None
    try:
        node = OmegaConf.select(defaults, key, default=None)
        value = OmegaConf.to_container(node) if isinstance(node, (DictConfig, ListConfig)) else node
    except Exception:
        return None
    if isinstance(value, str) and "${" in value or not _matches(value, tp):
        return None
    return "[" + ",".join(map(_cli, value)) + "]" if isinstance(value, list) else _cli(value)


def _example(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _example(args[0]) if args else "null"
    return {int: "8", float: "0.5", bool: "true", str: "some_text"}.get(tp, "[...]" if origin is list else "...")


def _check_constraints(key: str, value: Any, tp: Any, meta: Mapping[str, Any]) -> list[Issue]:
    issues: list[Issue] = []
    items = value if isinstance(value, list) else [value]
    choices = meta.get("choices")
    if choices is not None:
        bad = [v for v in items if v is not None and v not in choices]
        if bad:
            note = f" ({meta['note']})" if "note" in meta else ""
            issues.append(Issue(key, value, f"unknown name {bad[0]!r}{note}", f"use one of: {', '.join(choices)}"))
    bounds = [("ge", lambda v, b: v >= b, ">="), ("gt", lambda v, b: v > b, ">"), ("le", lambda v, b: v <= b, "<="), ("lt", lambda v, b: v < b, "<")]
    for name, ok, sym in bounds:
        bound = meta.get(name)
        if bound is None:
            continue
        for v in items:
            if isinstance(v, (int, float)) and not isinstance(v, bool) and not ok(v, bound):
                issues.append(Issue(key, value, f"must be {sym} {bound}", f"set {key} to a value {sym} {bound}"))
                break
    return issues


def _type_issue(key: str, value: Any, tp: Any, meta: Mapping[str, Any]) -> Issue:
    if typing.get_origin(tp) is typing.Literal:
        allowed = " or ".join(_cli(a) for a in typing.get_args(tp))
        note = f" ({meta['note']})" if "note" in meta else ""
        return Issue(key, value, f"not supported{note}", f"set {key}={allowed} (or remove the override)")
    default = _default_example(key, tp)
    example = f"{key}={default} (the default)" if default is not None else f"{key}={_example(tp)}"
    got = "null" if value is None else f"{type(value).__name__}"
    return Issue(key, value, f"expected {_type_name(tp)}, got {got}", f"give {_article(_type_name(tp))}, e.g. {example}")


def check_tree(node: DictConfig, cls: type, prefix: str = "", root: type | None = None) -> tuple[list[Issue], set[str]]:
    """Walk `node` against schema `cls`; returns (issues, keys with unusable values)."""
    root = root or cls
    issues: list[Issue] = []
    bad: set[str] = set()
    fields = schema_fields(cls)
    for key in node.keys():
        if str(key) not in fields:
            full = f"{prefix}{key}"
            if key == "_target_" or rule_for(full) is not None:
                continue  # verl's class tag, or a verl key megarl accepts (verl_compat.check checks its value)
            issues.append(unknown_key_issue(root, full))
            bad.add(full)
    for name, (tp, meta) in fields.items():
        key = f"{prefix}{name}"
        if name not in node:
            issues.append(Issue(key, no_value(), "missing key", f"add {key} (default in megarl/configs/megatron/ppo_megatron_trainer.yaml)"))
            bad.add(key)
            continue
        try:
            raw = node[name]
        except MissingMandatoryValue:
            issues.append(Issue(key, "???", "no value given", f"set {key}=<{_type_name(tp)}>"))
            bad.add(key)
            continue
        except Exception as exc:  # interpolation to a missing key, bad resolver, ...
            issues.append(Issue(key, no_value(), f"cannot resolve: {str(exc).splitlines()[0]}", f"fix the interpolation in {key}"))
            bad.add(key)
            continue
        if dataclasses.is_dataclass(tp):
            if isinstance(raw, DictConfig):
                sub_issues, sub_bad = check_tree(raw, tp, key + ".", root)
                issues += sub_issues
                bad |= sub_bad
            else:
                issues.append(Issue(key, raw, "expected a section (mapping)", f"restore {key} as a mapping; see the yaml"))
                bad.add(key)
            continue
        try:
            value = OmegaConf.to_container(raw, resolve=True) if isinstance(raw, (DictConfig, ListConfig)) else raw
        except Exception as exc:
            issues.append(Issue(key, no_value(), f"cannot resolve: {str(exc).splitlines()[0]}", f"fix the interpolation in {key}"))
            bad.add(key)
            continue
        shown = _followed_key(node, name) or key  # a value interpolated from another key is that key's problem
        if not _matches(value, tp):
            issues.append(_type_issue(shown, value, tp, meta))
            bad.add(key)
            continue
        found = _check_constraints(shown, value, tp, meta)
        if found:
            issues += found
            bad.add(key)
    if not prefix:  # the same problem reported by a key and the keys that follow it: once
        issues = list({(issue.key, issue.problem): issue for issue in issues}.values())
    return issues, bad


def _followed_key(node: DictConfig, name: str) -> str | None:
    """The dotted key ``node[name]`` is interpolated from (``${a.b}``, ``${oc.select:a.b,default}``), if any."""
    if not OmegaConf.is_interpolation(node, name):
        return None
    match = re.fullmatch(r"\$\{(?:oc\.select:)?([\w.]+)(?:,[^}]*)?\}", str(node._get_node(name)._value()))
    return match.group(1) if match else None


def _article(noun: str) -> str:
    return f"an {noun}" if noun[:1] in "aeiou" else f"a {noun}"


def _cli(value: Any) -> str:
    """`value` as written on a Hydra command line (true/false/null, bare strings)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
