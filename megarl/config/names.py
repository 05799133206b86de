"""Allowed names for string keys, in one place.

Algorithm names come from the live registries in `megarl.algorithms` (so a newly
registered estimator or loss is accepted without touching this file).
"""

from __future__ import annotations

from collections.abc import Iterable

# Estimators that normalize rewards within the rollout.n responses of one prompt: they
# need rollout.n >= 2 (a group of one has no baseline and no spread).
GROUP_ADV_ESTIMATORS: tuple[str, ...] = (
    "grpo",
    "grpo_passk",
    "rloo",
    "opo",
    "gpg",
    "reinforce_plus_plus_baseline",
    "gdpo",
    "optimal_token_baseline",
)

def _registry(name: str) -> tuple[str, ...]:
    import megarl.algorithms as algorithms  # here, not at the top: algorithms read config's schema

    return tuple(getattr(algorithms, name))


def adv_estimators() -> tuple[str, ...]:
    return _registry("ADV_ESTIMATORS")


def policy_losses() -> tuple[str, ...]:
    return _registry("POLICY_LOSSES")


def loss_agg_modes() -> tuple[str, ...]:
    return _registry("LOSS_AGG_MODES")


def kl_penalties() -> tuple[str, ...]:
    return _registry("KL_PENALTIES")


def kl_ctrl_types() -> tuple[str, ...]:
    return _registry("KL_CTRL_TYPES")


def rollout_is_levels() -> tuple[str, ...]:
    return _registry("ROLLOUT_IS_LEVELS")


def rollout_rs_options() -> tuple[str, ...]:
    return _registry("ROLLOUT_RS_OPTIONS")


def tool_parsers() -> tuple[str, ...]:
    """rollout.multi_turn.format: the tool-call parsers registered in megarl.agent.tool_parser."""
    from megarl.agent.tool_parser import TOOL_PARSERS

    return tuple(TOOL_PARSERS)


def rollout_corr_loss_types() -> tuple[str, ...]:
    return _registry("ROLLOUT_CORR_LOSS_TYPES")


DTYPES = ("auto", "float32", "bfloat16", "float16")
TRUNCATIONS = ("error", "left", "right", "middle")
CHECKPOINT_CONTENTS = ("model", "optimizer", "extra", "hf_model")
OPTIMIZERS = ("adam", "sgd")
LR_DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")  # megatron-core's OptimizerParamScheduler
WSD_DECAY_STYLES = ("exponential", "linear", "cosine", "minus_sqrt")
WD_INCR_STYLES = ("constant", "linear", "cosine")
GRAD_DTYPES = ("fp32", "bf16")
OPTIM_STATE_DTYPES = ("fp32", "bf16", "fp16", "fp8")
ROLLOUT_MODES = ("async", "sync")
TRUNCATE_SIDES = ("left", "middle", "right")  # rollout.multi_turn.tool_response_truncate_side
LORA_A_INITS = ("xavier", "kaiming", "normal")  # model.lora.lora_A_init_method (Megatron-Bridge's names)
REWARD_MANAGERS = ("naive", "batch", "prime", "dapo")
LOGGERS = ("console", "tensorboard", "wandb", "mlflow", "swanlab", "file")
# trainer.logger values backed by an optional package; each imports as, and pip-installs by, its name.
OPTIONAL_LOGGERS = ("tensorboard", "wandb", "mlflow", "swanlab")
DEVICES = ("auto", "cpu", "cuda")
RESUME_MODES = ("auto", "disable", "resume_path")
NAN_POLICIES = ("stop", "skip")  # trainer.nan_policy (megarl.utils.nonfinite)
LOAD_FORMATS = ("dummy", "auto")


def join(names: Iterable[str]) -> str:
    return ", ".join(names)
