"""megarl configuration: schema (dataclasses), up-front validation, loading.

Defaults live in `megarl/configs/megatron/ppo_megatron_trainer.yaml`; `megarl.config.schema`
gives each key's type and range; `validate_config` checks a composed config before any
worker starts and raises `ConfigError` naming every bad key, its value and the fix.
"""

from megarl.config.errors import ConfigError, Issue
from megarl.config.load import CONFIG_DIR, CONFIG_NAME, load_config, resolve_config
from megarl.config.roles import need_critic, need_reference
from megarl.config.schema import MegaRLConfig
from megarl.config.overrides import check_override_keys
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
    "need_critic",
    "need_reference",
    "resolve_config",
    "validate_config",
]
