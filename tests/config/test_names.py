"""megarl.config.names lists the runtime registries' names as plain tuples (config imports nothing of
the runtime): each tuple must be exactly what its registry holds, or the config would refuse a name the
runtime runs, or accept one it cannot."""

from __future__ import annotations

import pytest

from megarl.config import names


@pytest.mark.parametrize("config_names, registry", [
    ("ADV_ESTIMATORS", "megarl.algorithms:ADV_ESTIMATORS"),
    ("POLICY_LOSSES", "megarl.algorithms:POLICY_LOSSES"),
    ("TOOL_PARSERS", "megarl.agent.tool_parser:TOOL_PARSERS"),
])
def test_config_names_are_the_registered_ones(config_names, registry):
    import importlib

    module, attr = registry.split(":")
    registered = {n for n in getattr(importlib.import_module(module), attr) if not n.startswith(("_", "test_"))}
    assert set(getattr(names, config_names)) == registered
