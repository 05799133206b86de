"""The models of the run against what megarl.models builds: each model dir's config.json (actor,
reference, critic, reward model) must be an architecture megarl supports (model_type, activation,
sliding window, rope scaling, MoE layout). A rule run with the config's own rules, so a bad model and
a bad key are reported together."""

from __future__ import annotations

import types
from collections.abc import Iterator

from megarl.config.errors import Issue
from megarl.config.rules.model import built_models
from megarl.config.rules.view import View


def model_support(v: View) -> Iterator[Issue]:
    from megarl.models.config import SUPPORTED_MODEL_TYPES, unsupported_reason

    for role, hf in built_models(v):
        where = f"{v.path(role.model_path)}/config.json"
        model_type = hf.get("model_type")
        reason = unsupported_reason(types.SimpleNamespace(**hf))
        if model_type not in SUPPORTED_MODEL_TYPES:
            yield Issue(role.model_path, v.get(role.model_path), f"{where}: {reason}",
                        f"use a model of type: {', '.join(SUPPORTED_MODEL_TYPES)}")
            continue
        if reason:
            fix = f"use a supported model, or override the field with {role.override_config}" if role.override_config else "use a supported model"
            yield Issue(role.model_path, v.get(role.model_path), f"{where}: {reason}", fix)


RULES = (model_support,)
