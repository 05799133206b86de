"""Allowed names for string keys, in one place."""

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

# Names of the runtime's registries (megarl.algorithms, megarl.agent.tool_parser): the rules check
# a config against these; tests/config/test_names.py holds each registry to its tuple.
ADV_ESTIMATORS: tuple[str, ...] = (
    "gae", "grpo", "grpo_passk", "rloo", "reinforce_plus_plus_baseline", "reinforce_plus_plus", "remax", "opo", "gpg",
    "gdpo", "optimal_token_baseline",
)
POLICY_LOSSES: tuple[str, ...] = (
    "vanilla", "gpg", "clip_cov", "kl_cov", "gspo", "sapo", "cispo", "geo_mean", "dppo_tv", "dppo_kl", "dro", "bypass_mode",
)
TOOL_PARSERS: tuple[str, ...] = ("hermes",)  # rollout.multi_turn.format

LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
_BASE_KL_PENALTIES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full")
# A "+" suffix keeps the forward value of the estimator but takes the gradient of k2
# (straight-through), whose gradient is the unbiased KL gradient; k2/mse/full unchanged.
KL_PENALTIES: tuple[str, ...] = _BASE_KL_PENALTIES + tuple(
    f"{m}+" for m in _BASE_KL_PENALTIES if m not in ("mse", "k2", "full")
)
KL_CTRL_TYPES: tuple[str, ...] = ("fixed", "adaptive")
# algorithm.rollout_correction (megarl.algorithms.rollout_correction)
ROLLOUT_IS_LEVELS: tuple[str, ...] = ("token", "sequence", "geometric")
# Ratio options (verl <= 0.6 names) bound the IS ratio itself at the token / sequence-product
# / geometric-mean level; the k options bound a divergence estimate (current verl names).
ROLLOUT_RS_RATIO_OPTIONS: tuple[str, ...] = ("token", "sequence", "geometric")
ROLLOUT_RS_OPTIONS: tuple[str, ...] = ROLLOUT_RS_RATIO_OPTIONS + (
    "token_k1", "token_k2", "token_k3",
    "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3",
    "seq_max_k2", "seq_max_k3",
)  # fmt: skip
ROLLOUT_CORR_LOSS_TYPES: tuple[str, ...] = ("ppo_clip", "reinforce")

DTYPES = ("auto", "float32", "bfloat16", "float16")
# distillation.distillation_loss.loss_mode: verl's single-sample estimators of the per-token reverse KL
# (student vs teacher log-prob of the sampled token) and its top-k forward KL
DISTILLATION_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
DISTILLATION_LOSS_MODES = DISTILLATION_ESTIMATORS + ("forward_kl_topk",)
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
ROUTER_REPLAY_MODES = ("disabled", "R2", "R3")  # *.megatron.router_replay.mode (verl's EngineRouterReplayConfig)
TRAINER_MODES = ("sync", "colocate_async", "separate_async")  # trainer.v1.trainer_mode (megarl.trainer.v1)
OFF_POLICY_STRATEGIES = ("drop", "wait")  # trainer.v1.sampler.max_off_policy_strategy


def join(names: Iterable[str]) -> str:
    return ", ".join(names)
