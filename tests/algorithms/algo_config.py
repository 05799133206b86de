"""Typed config sections for the algorithm tests, taken from the project yaml exactly as a run
composes it (`typed_config(load_config(CPU_SMALL + overrides))`), never built by hand.

`project(*overrides)` composes (Hydra override strings; about 0.4 s each, so cached). The section
helpers (`actor(clip_ratio_c=3.0, policy_loss={"dro_beta": 0.1})`) take the composed section and
set the given fields with `dataclasses.replace` (a dict value sets fields of a nested section), so
one composition serves the whole suite. A test states every value its expected numbers depend on,
so it does not lean on the yaml's defaults. Returned sections are shared: do not mutate them.
"""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import Any, TypeVar

from helpers.cpu_config import CPU_SMALL
from megarl.config import load_config
from megarl.config.schema.root import MegaRLConfig
from megarl.config.schema.actor import ActorConfig
from megarl.config.schema.algorithm import AlgorithmConfig, KLCtrlConfig, RolloutCorrectionConfig
from megarl.config.read import typed_config

# typed_config needs no files (only validation does): any model path skips the demo profile.
_BASE = [*CPU_SMALL, "actor_rollout_ref.model.path=/x"]
S = TypeVar("S")


@cache
def project(*overrides: str) -> MegaRLConfig:
    """The whole typed config with `overrides` (full dotted Hydra strings)."""
    return typed_config(load_config([*_BASE, *overrides]))


def with_values(section: S, values: dict[str, Any]) -> S:
    """`section` with `values` set; a dict value sets fields of the nested section of that name."""
    names = {f.name for f in dataclasses.fields(section)}
    unknown = set(values) - names
    if unknown:
        raise KeyError(f"{type(section).__name__} has no field(s) {sorted(unknown)}")
    changes = {
        k: with_values(getattr(section, k), v) if isinstance(v, dict) and dataclasses.is_dataclass(getattr(section, k))
        else v
        for k, v in values.items()
    }
    return dataclasses.replace(section, **changes)


def actor(**values: Any) -> ActorConfig:
    """`actor_rollout_ref.actor` (what the policy losses receive)."""
    return with_values(project().actor_rollout_ref.actor, values)


def algorithm(**values: Any) -> AlgorithmConfig:
    """`algorithm` (compute_advantage's config)."""
    return with_values(project().algorithm, values)


def kl_ctrl(**values: Any) -> KLCtrlConfig:
    """`algorithm.kl_ctrl`."""
    return with_values(project().algorithm.kl_ctrl, values)


def rollout_correction(**values: Any) -> RolloutCorrectionConfig:
    """`algorithm.rollout_correction`."""
    return with_values(project().algorithm.rollout_correction, values)
