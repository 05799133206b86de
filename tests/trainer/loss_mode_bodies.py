"""Rank body for test_every_loss_mode: one Megatron ActorWorker, one PPO step per loss mode.

Run through ``dist_utils.run_distributed`` (world size 1, gloo, CPU); the tiny Qwen2 model
and batch come from ``tests/helpers/tiny.py``.
"""

from __future__ import annotations

from typing import Any

import torch

TEMPERATURE = 0.7
LR, CLIP_GRAD = 0.1, 1.0
OLD_LOGP_NOISE = 0.05  # old log-probs = current ones + noise: ratios near 1, as in a real first step


def _params(actor) -> list[torch.Tensor]:
    return [p.detach().clone() for chunk in actor.engine.chunks for p in chunk.parameters()]


def one_step_per_loss_mode(model_path: str, batch: dict[str, torch.Tensor],
                           cases: dict[str, tuple[str, dict[str, Any], dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """For each case ``name -> (loss_mode, policy_loss values, rollout_correction values)``: set the
    worker's ``actor.policy_loss`` (the yaml's node with those values) and its
    ``algorithm.rollout_correction`` (the project config's typed section with those values, as the
    trainer hands it to the worker), take one update, and report the worker's metrics, the loss
    of the registry function on the worker's own log-probs before the step (the reference)
    and the norm of the parameter change. One mini-batch and one micro-batch per step, so the
    worker's ``actor/pg_loss`` is that function's value on the whole batch. Plain SGD from an
    empty state without weight decay: the step is ``-lr * clipped gradient``."""
    import dataclasses

    from helpers.cpu_config import CPU_SMALL
    from megarl.algorithms import get_policy_loss
    from megarl.config import load_config
    from megarl.config.read import typed_config
    from megarl.protocol import DataProto
    from megarl.workers.actor import ActorWorker
    from helpers.tiny import actor_rollout_ref_config, megatron_node

    cfg = actor_rollout_ref_config(
        model_path, megatron_node(), entropy_coeff=0.0, use_kl_loss=False,  # weights move only through the pg loss
        ppo_mini_batch_size=len(batch["responses"]), ppo_micro_batch_size_per_gpu=len(batch["responses"]),
    )
    cfg.actor.optim.weight_decay = 0.0  # no decay and (below) no momentum: the weights move only by this step's gradient
    cfg.actor.optim.lr, cfg.actor.optim.clip_grad = LR, CLIP_GRAD
    yaml_policy_loss = cfg.actor.policy_loss
    yaml_rollout_correction = typed_config(
        load_config([*CPU_SMALL, f"actor_rollout_ref.model.path={model_path}"])
    ).algorithm.rollout_correction
    actor = ActorWorker(cfg, "actor", device="cpu")
    actor.init_model()
    gen = torch.Generator().manual_seed(0)
    mask = batch["response_mask"]
    out: dict[str, dict[str, Any]] = {}
    for name, (mode, policy_loss, rollout_correction) in cases.items():
        actor.config.actor.policy_loss = dataclasses.replace(yaml_policy_loss, loss_mode=mode, **policy_loss)
        actor.rollout_correction = dataclasses.replace(yaml_rollout_correction, **rollout_correction)
        data = DataProto.from_dict(dict(batch), meta_info={"temperature": TEMPERATURE, "nan_policy": "stop"})
        log_prob = actor.compute_log_prob(data).batch["old_log_probs"]
        old = (log_prob + OLD_LOGP_NOISE * torch.randn(log_prob.shape, generator=gen)) * mask
        data.batch["old_log_probs"] = old
        extra = {"rollout_correction": actor.rollout_correction} if mode == "bypass_mode" else {}
        reference, _ = get_policy_loss(mode)(old, log_prob, batch["advantages"], mask,
                                             actor.config.actor.loss_agg_mode, actor.config.actor, **extra)
        actor.engine.optimizer.optimizer.state.clear()  # SGD momentum buffers of the previous case
        before = _params(actor)
        metrics = actor.update_policy(data)
        change = torch.cat([(a - b).flatten() for a, b in zip(_params(actor), before)]).norm().item()
        out[name] = {"metrics": metrics, "reference_pg_loss": float(reference), "param_change_norm": change}
    return out
