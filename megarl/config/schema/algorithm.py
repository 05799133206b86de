"""Schema of `algorithm`: advantage estimator, KL in reward, group filter, rollout correction; and
the parsers of rollout correction's threshold specs (verl's strings, explained in
megarl/algorithms/rollout_correction.py), which both the rules and the algorithm use."""

from __future__ import annotations

from dataclasses import dataclass

from megarl.config.names import (
    ADV_ESTIMATORS,
    KL_CTRL_TYPES,
    KL_PENALTIES,
    ROLLOUT_CORR_LOSS_TYPES,
    ROLLOUT_IS_LEVELS,
    ROLLOUT_RS_RATIO_OPTIONS,
)
from megarl.config.schema.field import Section, spec


@dataclass
class KLCtrlConfig(Section):
    type: str = spec(choices=KL_CTRL_TYPES)
    kl_coef: float = spec(ge=0)
    horizon: int = spec(gt=0)
    target_kl: float = spec(gt=0)


@dataclass
class FilterGroupsConfig(Section):
    enable: bool = spec()
    metric: str = spec()  # names are checked at runtime against the reward's extra info
    max_num_gen_batches: int = spec(ge=0)


@dataclass
class RolloutCorrectionConfig(Section):
    rollout_is: str | None = spec(choices=ROLLOUT_IS_LEVELS)
    # "lower_upper" strings and comma lists: parse_is_threshold / parse_rs_thresholds below
    rollout_is_threshold: float | str = spec(gt=0)
    rollout_is_batch_normalize: bool = spec()
    rollout_rs: str | None = spec()
    rollout_rs_threshold: float | str | None = spec(gt=0)
    rollout_rs_threshold_lower: float | None = spec(gt=0)
    rollout_token_veto_threshold: float | None = spec(gt=0)
    bypass_mode: bool = spec()
    loss_type: str = spec(choices=ROLLOUT_CORR_LOSS_TYPES)


@dataclass
class AlgorithmConfig(Section):
    gamma: float = spec(ge=0, le=1)
    lam: float = spec(ge=0, le=1)
    adv_estimator: str = spec(choices=ADV_ESTIMATORS)
    norm_adv_by_std_in_grpo: bool = spec()
    gdpo_reward_keys: list[str] | None = spec()
    gdpo_reward_weights: list[float] | None = spec()
    use_kl_in_reward: bool = spec()
    kl_penalty: str = spec(choices=KL_PENALTIES)
    kl_ctrl: KLCtrlConfig = spec()
    filter_groups: FilterGroupsConfig = spec()
    rollout_correction: RolloutCorrectionConfig = spec()


_KEY = "algorithm.rollout_correction."


def parse_is_threshold(given: float | str) -> tuple[float, float | None]:
    """`rollout_is_threshold` -> (upper, lower or None)."""
    if isinstance(given, bool) or not isinstance(given, (int, float, str)):
        raise ValueError(f"{_KEY}rollout_is_threshold must be a number or 'lower_upper', got {given!r}")
    parts = str(given).strip().split("_")
    try:
        nums = [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"{_KEY}rollout_is_threshold: cannot parse {given!r}") from None
    if len(nums) == 1:
        upper, lower = nums[0], None
    elif len(nums) == 2:
        lower, upper = nums
    else:
        raise ValueError(f"{_KEY}rollout_is_threshold: cannot parse {given!r}")
    if upper <= 0 or (lower is not None and not 0 < lower <= upper):
        raise ValueError(f"{_KEY}rollout_is_threshold needs 0 < lower <= upper, got {given!r}")
    return upper, lower


def parse_rs_thresholds(options: list[str], given: float | str | None) -> dict[str, tuple[float | None, float]]:
    """`rollout_rs_threshold` -> {option: (lower or None, upper)} (k1 bounds are ratios)."""
    if given is None:
        raise ValueError(f"{_KEY}rollout_rs_threshold must be set when rollout_rs is enabled")
    specs = [s.strip() for s in str(given).split(",") if s.strip()]
    if len(specs) == 1:
        specs = specs * len(options)
    if len(specs) != len(options):
        raise ValueError(
            f"{_KEY}rollout_rs_threshold has {len(specs)} entries for {len(options)} rollout_rs options {options}"
        )
    out: dict[str, tuple[float | None, float]] = {}
    for opt, s in zip(options, specs):
        try:
            nums = [float(p) for p in s.split("_")]
        except ValueError:
            raise ValueError(f"{_KEY}rollout_rs_threshold: cannot parse {s!r} for {opt}") from None
        if opt.endswith("k1") or opt in ROLLOUT_RS_RATIO_OPTIONS:
            lower, upper = (1.0 / nums[0], nums[0]) if len(nums) == 1 else (nums[0], nums[1])
            if len(nums) > 2 or not 0 < lower <= upper:
                raise ValueError(
                    f"{_KEY}rollout_rs_threshold for {opt} needs ratio bounds 0 < lower <= upper, got {s!r}"
                )
            out[opt] = (lower, upper)
        else:
            if len(nums) != 1 or nums[0] <= 0:
                raise ValueError(f"{_KEY}rollout_rs_threshold for {opt} needs one positive upper bound, got {s!r}")
            out[opt] = (None, nums[0])
    return out
