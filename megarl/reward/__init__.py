"""Rewards: rule scorers by data_source, custom scoring functions, reward managers."""

from megarl.reward.custom import RewardFunctionError, load_reward_fn
from megarl.reward.default import default_compute_score, known_data_sources
from megarl.reward.managers import (
    REWARD_MANAGERS,
    RewardError,
    RewardManager,
    build_reward_manager,
    decode_responses,
    place_scores,
)

__all__ = [
    "REWARD_MANAGERS",
    "RewardError",
    "RewardFunctionError",
    "RewardManager",
    "build_reward_manager",
    "decode_responses",
    "default_compute_score",
    "known_data_sources",
    "load_reward_fn",
    "place_scores",
]
