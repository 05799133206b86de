"""Schema of `distillation` (verl 0.9.1's on-policy distillation keys): a frozen teacher's log-probs
on the student's rollouts as a per-token loss (megarl.algorithms.distillation), the teacher a
forward-only Megatron-Core worker (megarl.workers.teacher)."""

from __future__ import annotations

from dataclasses import dataclass

from megarl.config.names import DISTILLATION_LOSS_MODES, DTYPES
from megarl.config.schema.field import Section, spec


@dataclass
class DistillationLossConfig(Section):
    loss_mode: str = spec(choices=DISTILLATION_LOSS_MODES)
    topk: int | None = spec(ge=1)  # forward_kl_topk: teacher log-probs kept per token
    use_task_rewards: bool = spec()  # policy loss + distillation_loss_coef x distillation loss; false: distillation loss alone
    distillation_loss_coef: float = spec()
    loss_max_clamp: float | None = spec(gt=0)  # per-token loss clamped to [-c, c]
    log_prob_min_clamp: float | None = spec()  # forward_kl_topk: log-probs clamped below (as verl; estimators ignore it)
    use_policy_gradient: bool = spec()  # -loss as the advantage of a vanilla PPO clip loss (detached), else backpropagated
    policy_loss_mode: str = spec(choices=("vanilla",), note="verl supports only the vanilla policy loss here")
    clip_ratio: float = spec(gt=0)
    clip_ratio_low: float | None = spec(gt=0)
    clip_ratio_high: float | None = spec(gt=0)


@dataclass
class TeacherInferenceConfig(Section):
    """verl's teacher vLLM server settings as megarl's Megatron-Core forward reads them."""

    dtype: str = spec(choices=DTYPES)  # megatron params dtype
    free_cache_engine: bool = spec()  # weights offloaded to host between calls (megatron param_offload)
    tensor_model_parallel_size: int = spec(ge=1)
    max_model_len: int | None = spec(ge=1)  # must hold prompt_length + response_length + 1 (verl's check)
    max_num_seqs: int = spec(ge=1)  # sequences per forward micro-batch (per data-parallel rank)
    prompt_length: int = spec(ge=1)
    response_length: int = spec(ge=1)
    temperature: float = spec(gt=0)  # the teacher's log-probs are of softmax(logits / temperature)


@dataclass
class TeacherModelConfig(Section):
    model_path: str | None = spec(path=True)
    inference: TeacherInferenceConfig = spec()


@dataclass
class TeacherModelsConfig(Section):
    """One teacher (verl's `teacher_model` entry); routing among several by teacher_key is refused."""

    teacher_model: TeacherModelConfig = spec()


@dataclass
class DistillationConfig(Section):
    enabled: bool = spec()
    distillation_loss: DistillationLossConfig = spec()
    n_gpus_per_node: int = spec(ge=1)  # teacher pool (nnodes > 0)
    nnodes: int = spec(ge=0)  # 0: the teacher shares the trainer's GPUs; > 0: its own pool of nnodes x n_gpus_per_node
    teacher_models: TeacherModelsConfig = spec()

    def uses_topk(self) -> bool:
        """Whether the loss reads the teacher's top-k log-probs (forward_kl_topk) rather than its
        log-prob of the sampled token."""
        return self.distillation_loss.loss_mode == "forward_kl_topk"
