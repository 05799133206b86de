"""Rank body for the NaN/Inf update tests (spawned by dist_utils.run_distributed, 1 rank)."""

from __future__ import annotations

import torch

from helpers.tiny import actor_rollout_ref_config, critic_config, megatron_node, optim_node


def _data(batch: dict, rows=slice(None), **meta):
    from megarl.protocol import DataProto

    return DataProto.from_dict({k: v[rows] for k, v in batch.items()}, meta_info={"temperature": 0.7, "nan_policy": "stop", **meta})


def _weights(worker) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in worker.export_hf_weights()}


def _error(fn) -> str | None:
    from megarl.utils.nonfinite import NonFiniteError

    try:
        fn()
    except NonFiniteError as error:
        return str(error)
    return None


def nonfinite_updates(model_path: str, batch: dict) -> dict:
    """Actor: NaN advantage in mini-batch 1 of 2 under stop / skip, and the skip reference
    (an update on mini-batch 2 alone); critic (clip_grad=0): a finite update, then Inf returns."""
    from megarl.workers.actor import ActorWorker
    from megarl.workers.critic import CriticWorker

    out: dict = {}
    cfg = actor_rollout_ref_config(model_path, megatron_node(), ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2)
    poisoned = {**batch, "advantages": batch["advantages"].clone()}
    poisoned["advantages"][0, 0] = float("nan")

    stop = ActorWorker(cfg, "actor", device="cpu")
    stop.init_model()
    before = _weights(stop)
    out["actor_error"] = _error(lambda: stop.update_policy(_data(poisoned, global_step=5, nan_policy="stop")))
    out["actor_unchanged"] = all(torch.equal(before[n], t) for n, t in _weights(stop).items())
    del stop

    skip = ActorWorker(cfg, "actor", device="cpu")
    skip.init_model()
    out["skip_metrics"] = skip.update_policy(_data(poisoned, global_step=5, nan_policy="skip"))
    out["skip_weights"] = _weights(skip)
    del skip
    reference = ActorWorker(cfg, "actor", device="cpu")
    reference.init_model()
    out["reference_metrics"] = reference.update_policy(_data(batch, slice(4, 8), global_step=5))
    out["reference_weights"] = _weights(reference)
    out["initial_weights"] = before
    del reference

    poisoned_weight = ActorWorker(cfg, "actor", device="cpu")
    poisoned_weight.init_model()
    with torch.no_grad():
        next(p for n, p in poisoned_weight.engine.unwrapped_chunks()[0].named_parameters() if "linear_fc1" in n)[0, 0] = float("inf")
    out["weight_error"] = _error(lambda: poisoned_weight.update_policy(_data(batch, global_step=9)))
    del poisoned_weight

    critic = CriticWorker(critic_config(model_path, megatron_node(), optim=optim_node(
        optimizer="sgd", lr=0.5, weight_decay=0.0, clip_grad=0.0)), device="cpu")
    critic.init_model()
    out["critic_metrics"] = critic.update_critic(_data(batch, global_step=6))
    bad = {**batch, "returns": batch["returns"].clone()}
    bad["returns"][3, 0] = float("inf")
    out["critic_error"] = _error(lambda: critic.update_critic(_data(bad, global_step=7)))
    return out
