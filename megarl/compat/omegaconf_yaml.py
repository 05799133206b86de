"""OmegaConf's YAML loader on libyaml's parser.

Hydra reads megarl's config files (and its own) at every compose through ``OmegaConf.load``, whose loader
(``omegaconf._utils.get_yaml_loader``) subclasses PyYAML's pure-Python ``SafeLoader``: ~0.3 s of every compose
on the CI machines (each driver start, dry run and config test), where libyaml's ``CSafeLoader`` takes 0.02 s.
:func:`apply_c_yaml_loader` gives OmegaConf the same loader over ``CSafeLoader``: OmegaConf's constructors and
implicit resolvers (its float rule, no timestamps) copied from its own class, and its duplicate-key check. The
documents parse equal (tests/compat/test_omegaconf_yaml.py). Without libyaml nothing changes.
"""

from __future__ import annotations

import functools
from typing import Any

import yaml
from omegaconf import _utils, basecontainer

from megarl.compat.shim import Shim, source_has

__all__ = ["SHIMS", "apply_c_yaml_loader", "c_yaml_loader", "omegaconf_yaml_loader"]

omegaconf_yaml_loader = _utils.get_yaml_loader  # OmegaConf's own, kept before apply_c_yaml_loader replaces it

SHIMS = (
    Shim("omegaconf get_yaml_loader on CSafeLoader", ("omegaconf==2.3.0", "omegaconf==2.3.1"), ("cpu", "gpu"),
         "omegaconf/_utils.py get_yaml_loader builds its loader on yaml.SafeLoader (pure Python) at every call; "
         "OmegaConf.load (omegaconf.py:186) and BaseContainer (basecontainer.py:22) call it for every file Hydra reads",
         source_has("omegaconf._utils", "get_yaml_loader", "class OmegaConfLoader(yaml.SafeLoader)")),
)


@functools.cache
def c_yaml_loader() -> type:
    """OmegaConf's loader class rebuilt on ``yaml.CSafeLoader`` (built once)."""
    original = omegaconf_yaml_loader()

    class CLoader(yaml.CSafeLoader):
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> Any:
            keys = set()
            for key_node, _ in node.value:  # OmegaConf refuses a key given twice in one mapping
                if key_node.tag != yaml.resolver.BaseResolver.DEFAULT_SCALAR_TAG:
                    continue
                if key_node.value in keys:
                    raise yaml.constructor.ConstructorError("while constructing a mapping", node.start_mark,
                                                            f"found duplicate key {key_node.value}", key_node.start_mark)
                keys.add(key_node.value)
            return super().construct_mapping(node, deep=deep)

    CLoader.yaml_implicit_resolvers = {key: list(rules) for key, rules in original.yaml_implicit_resolvers.items()}
    CLoader.yaml_constructors = dict(original.yaml_constructors)
    return CLoader


def apply_c_yaml_loader() -> None:
    """OmegaConf's readers take :func:`c_yaml_loader` (idempotent; nothing without libyaml)."""
    if not yaml.__with_libyaml__:
        return
    loader = c_yaml_loader()
    _utils.get_yaml_loader = basecontainer.get_yaml_loader = lambda: loader
