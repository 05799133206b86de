"""megarl configuration: the typed schema, up-front validation, and the reader.

Defaults live in `megarl/configs/megatron/ppo_megatron_trainer.yaml`; `megarl.config.schema` gives
each key's type and range; `validate_config` checks a composed config before any worker starts and
raises `ConfigError` naming every bad key, its value and the fix; `typed_config` turns the resolved
config into the `MegaRLConfig` the run receives. This package imports nothing of megarl's runtime.
"""

from megarl.config.check_overrides import check_override_keys
from megarl.config.compose import load_config
from megarl.config.errors import ConfigError, Issue
from megarl.config.files import CONFIG_DIR, CONFIG_NAME
from megarl.config.read import resolve_config, typed_config
from megarl.config.schema.root import MegaRLConfig
from megarl.config.validate import check_schema, collect_issues, validate_config

__all__ = [
    "CONFIG_DIR",
    "CONFIG_NAME",
    "ConfigError",
    "Issue",
    "MegaRLConfig",
    "check_schema",
    "check_override_keys",
    "collect_issues",
    "load_config",
    "resolve_config",
    "typed_config",
    "validate_config",
]
