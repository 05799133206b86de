"""Checks that need megarl's runtime, run in the driver before Ray starts: the architectures
megarl.models builds (`RUNTIME_RULES`, run with the config's own rules by `validate_config`), then
`preflight`: the tokenizer, datasets and reward function loaded as the trainer will, and the local
machine's room for the requested slots."""

from megarl.preflight.models import RULES as RUNTIME_RULES
from megarl.preflight.run import preflight

__all__ = ["RUNTIME_RULES", "preflight"]
