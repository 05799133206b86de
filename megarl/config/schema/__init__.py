"""The typed config: one dataclass per section of ppo_megatron_trainer.yaml (root: `MegaRLConfig`);
types and constraints only, the yaml holds the defaults."""

from megarl.config.schema.root import MegaRLConfig

__all__ = ["MegaRLConfig"]
