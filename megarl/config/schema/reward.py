"""Schema of `reward` (verl 0.9 layout) and the legacy top-level reward keys it replaces."""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

from megarl.config.names import DTYPES, REWARD_MANAGERS
from megarl.config.schema.field import Section, spec


@dataclass
class CustomRewardFunctionConfig(Section):
    path: str | None = spec(path=True)
    name: str | None = spec()
    reward_kwargs: dict[str, Any] = spec()


@dataclass
class RewardManagerConfig(Section):
    name: str = spec(choices=REWARD_MANAGERS)


@dataclass
class RewardModelRolloutConfig(Section):
    """verl's `reward.reward_model.rollout` (its vLLM server) as megarl's Megatron-Core forward reads it."""

    dtype: str = spec(choices=DTYPES)  # megatron params dtype
    free_cache_engine: bool = spec()  # weights offloaded to host between scoring calls (megatron param_offload)
    tensor_model_parallel_size: int = spec(ge=1)
    pipeline_model_parallel_size: int = spec(ge=1)
    max_model_len: int | None = spec(ge=1)  # tokens of one reward-model input; null = prompt_length + response_length
    max_num_seqs: int = spec(ge=1)  # sequences per forward micro-batch (per data-parallel rank)
    prompt_length: int = spec(ge=1)
    response_length: int = spec(ge=1)

    def max_length(self) -> int:
        """The longest reward-model input in tokens (verl's vLLM server: max_model_len or prompt + response)."""
        return self.max_model_len or self.prompt_length + self.response_length


@dataclass
class RewardModelConfig(Section):
    """A discriminative (sequence-classification) reward model scoring each response."""

    enable: bool = spec()
    model_path: str | None = spec(path=True)
    rollout: RewardModelRolloutConfig = spec()


@dataclass
class RewardConfig(Section):
    timeout: float = spec(gt=0)  # seconds one scoring call may take
    num_workers: int = spec(ge=1)  # scoring processes: calls of the per-row managers run this many at once
    phase_timeout: float | None = spec(gt=0)  # megarl: seconds a batch's scoring may take (null: 2 x timeout)
    reward_model: RewardModelConfig = spec()
    custom_reward_function: CustomRewardFunctionConfig = spec()
    reward_manager: RewardManagerConfig = spec()
    reward_kwargs: dict[str, Any] = spec()
    launch_reward_fn_async: bool = spec()

    def phase_timeout_s(self) -> float:
        """Seconds a batch's scoring may take: ``phase_timeout``, or twice a call's ``timeout``."""
        return self.phase_timeout if self.phase_timeout is not None else 2 * self.timeout


@dataclass
class LegacyCustomRewardFunctionConfig(Section):
    """verl's top-level `custom_reward_function` (null = use reward.custom_reward_function)."""

    path: str | None = spec(path=True)
    name: str | None = spec()


@dataclass
class LegacyRewardModelConfig(Section):
    """verl's top-level `reward_model` keys megarl migrates (the rest are in verl_compat.accepted_keys)."""

    reward_manager: str | None = spec(choices=REWARD_MANAGERS)
    enable: bool | None = spec()


OVERLONG_KEY = "reward.reward_kwargs.overlong_buffer_cfg"


@dataclass(frozen=True)
class OverlongBufferConfig:
    """DAPO's soft overlong penalty, `reward.reward_kwargs.overlong_buffer_cfg` (verl's place)."""

    enable: bool
    len: int  # tokens of the soft-penalty zone before max_response_length
    penalty_factor: float  # penalty at max_response_length (linear from 0 at the zone start)
    log: bool  # also report the penalty per response


def overlong_buffer(reward_kwargs: dict[str, Any]) -> OverlongBufferConfig | None:
    """The overlong-buffer settings in `reward_kwargs`, or None; ValueError names a bad field."""
    raw = reward_kwargs.get("overlong_buffer_cfg")  # a free-form mapping: absence is meaningful
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ValueError("must be a mapping")
    unknown = set(raw) - {"enable", "len", "penalty_factor", "log"}
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}")
    missing = {"enable", "len", "penalty_factor"} - set(raw)
    if raw.get("enable") and missing:
        raise ValueError(f"enable is true but {sorted(missing)} are not given")
    cfg = OverlongBufferConfig(bool(raw.get("enable", False)), raw.get("len", 0), raw.get("penalty_factor", 0.0), bool(raw.get("log", False)))
    if cfg.enable and (not isinstance(cfg.len, int) or isinstance(cfg.len, bool) or cfg.len < 1):
        raise ValueError(f"len must be an integer >= 1, got {cfg.len!r}")
    if cfg.enable and (not isinstance(cfg.penalty_factor, (int, float)) or cfg.penalty_factor < 0):
        raise ValueError(f"penalty_factor must be a number >= 0, got {cfg.penalty_factor!r}")
    return cfg
