"""On-policy distillation losses (verl's `distillation.distillation_loss`), pure functions.

Per response token the student is compared with a frozen teacher on the student's own rollout:
- estimator modes (kl|k1|abs|mse|k2|low_var_kl|k3): an estimate of the reverse KL(student ||
  teacher) from the sampled token's two log-probs (megarl.algorithms.kl.kl_penalty with the
  teacher as the reference);
- forward_kl_topk: KL(teacher || student) over the teacher's top-k tokens, computed from the
  student's vocab-parallel logits (megarl.workers.megatron.vocab_topk) and passed in here per token.

`distillation_objective` turns the per-token loss `[batch, response_len]` into the actor's scalar
the way verl does: backpropagated (aggregated like the policy loss), or with `use_policy_gradient`
as the advantage -loss of a vanilla PPO clip loss; with `use_task_rewards` added to the policy
loss times `distillation_loss_coef`, else alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from megarl.algorithms.agg import Denominator, agg_loss
from megarl.algorithms.kl import kl_penalty
from megarl.algorithms.policy_loss_base import get_policy_loss

if TYPE_CHECKING:
    from megarl.config.schema.actor import ActorConfig
    from megarl.config.schema.distillation import DistillationLossConfig

__all__ = ["estimator_losses", "distillation_objective", "combine_with_policy_loss"]


def estimator_losses(student_log_prob: torch.Tensor, teacher_log_prob: torch.Tensor, mode: str) -> torch.Tensor:
    """Per-token estimate of KL(student || teacher) `[batch, response_len]` from the sampled
    token's log-probs (each `[batch, response_len]`); `mode` as `kl_penalty` (k3 clamped to [-10, 10])."""
    return kl_penalty(student_log_prob, teacher_log_prob, mode)


def distillation_objective(
    token_losses: torch.Tensor,
    response_mask: torch.Tensor,
    config: DistillationLossConfig,
    loss_agg_mode: str,
    global_denominator: Denominator,
    *,
    pg_config: ActorConfig,
    old_log_prob: torch.Tensor | None = None,
    log_prob: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The distillation loss scalar from per-token losses `[batch, response_len]`.

    Clamped to [-loss_max_clamp, loss_max_clamp] when set. `use_policy_gradient`: vanilla PPO clip
    with advantages -loss (detached), `old_log_prob` / `log_prob` `[batch, response_len]` and
    `pg_config` (the actor section with the distillation clip ratios); else `agg_loss` of the loss.
    Metrics: distillation/loss_min, loss_max (over valid tokens, before the clamp).
    """
    valid = token_losses.detach()[response_mask.bool()]
    metrics = {"distillation/loss_min": valid.min().item() if valid.numel() else 0.0,
               "distillation/loss_max": valid.max().item() if valid.numel() else 0.0}
    if config.loss_max_clamp is not None:
        token_losses = token_losses.clamp(-config.loss_max_clamp, config.loss_max_clamp)
    if config.use_policy_gradient:
        loss, pg = get_policy_loss(config.policy_loss_mode)(  # vanilla: the one verl supports here
            old_log_prob, log_prob, -token_losses.detach(), response_mask, loss_agg_mode, pg_config,
            global_denominator, rollout_is_weights,
        )
        metrics.update({f"distillation/{k.split('/', 1)[1]}": v for k, v in pg.items()})
        return loss, metrics
    return agg_loss(token_losses, response_mask, loss_agg_mode, global_denominator, pg_config.loss_scale_factor), metrics


def combine_with_policy_loss(
    policy_loss: torch.Tensor, distillation_loss: torch.Tensor, config: DistillationLossConfig
) -> torch.Tensor:
    """verl's combination: policy_loss + distillation_loss_coef x distillation_loss with
    `use_task_rewards`, else the distillation loss alone (the task reward's advantage unused)."""
    if config.use_task_rewards:
        return policy_loss + config.distillation_loss_coef * distillation_loss
    return distillation_loss
