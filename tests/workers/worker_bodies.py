"""Rank bodies for the multi-process worker tests (spawned by dist_utils.run_distributed)."""

from __future__ import annotations

import torch

from helpers.tiny import actor_rollout_ref_config, critic_config, dp_rows, megatron_node, worker_data


def _export(worker) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in worker.export_hf_weights()}


def _allow_checkpoint_writer_processes() -> None:
    """dist_utils ranks are daemonic; megatron's dist-checkpoint writer forks writer
    processes and starts a multiprocessing manager, which daemonic processes may not.
    Ray workers / torchrun ranks are not daemonic, so this is test-only."""
    import multiprocessing

    multiprocessing.current_process()._config["daemon"] = False


def _rank0(value):
    return value if torch.distributed.get_rank() == 0 else None


def actor_and_critic(
    model_path: str, batch: dict, megatron: dict, ckpt_dir: str | None = None, actor_overrides: dict | None = None,
    remove_padding: bool = False,
) -> dict:
    """Log-probs (actor + ref; the actor with sum_pi_squared), one PPO step, critic values + one
    step; optional checkpoint. `remove_padding`: model.use_remove_padding (thd packing) of both."""
    from megarl.workers.actor import ActorWorker
    from megarl.workers.critic import CriticWorker

    out: dict = {}
    cfg = actor_rollout_ref_config(model_path, megatron, **{"calculate_sum_pi_squared": True, **(actor_overrides or {})})
    cfg.model.use_remove_padding = remove_padding
    actor = ActorWorker(cfg, "actor", device="cpu")
    actor.init_model()
    rows = dp_rows(batch)
    data = worker_data(batch, rows)
    log_probs = actor.compute_log_prob(data)
    ref = ActorWorker(cfg, "ref", device="cpu")
    ref.init_model()
    out["log_probs"] = log_probs.batch["old_log_probs"]
    out["entropys"] = log_probs.batch["entropys"]
    out["sum_pi_squared"] = log_probs.batch["sum_pi_squared"]
    ref_out = ref.compute_log_prob(data)
    out["ref_log_prob"] = ref_out.batch["ref_log_prob"]
    out["ref_keys"] = sorted(ref_out.batch.keys())
    out["metrics"] = actor.update_policy(data)
    out["updated"] = _rank0(_export(actor))
    if ckpt_dir is not None:
        _allow_checkpoint_writer_processes()
        actor.save_checkpoint(ckpt_dir)
        out["log_probs_after_step"] = actor.compute_log_prob(data).batch["old_log_probs"]
        out["metrics_step2"] = actor.update_policy(data)
        out["updated_step2"] = _rank0(_export(actor))

    critic = CriticWorker(critic_config(model_path, megatron, model={"override_config": {}, "use_remove_padding": remove_padding}),
                          device="cpu")
    critic.init_model()
    head = critic.value_head_weight()
    out["value_head"] = None if head is None else head.detach().clone()
    out["values"] = critic.compute_values(data).batch["values"]
    out["critic_metrics"] = critic.update_critic(data)
    out["critic_values_after"] = critic.compute_values(data).batch["values"]
    return out


def resume_from_checkpoint(model_path: str, batch: dict, megatron: dict, ckpt_dir: str) -> dict:
    """Fresh actor, load `ckpt_dir` (any layout), then log-probs and a second step."""
    from megarl.workers.actor import ActorWorker

    actor = ActorWorker(actor_rollout_ref_config(model_path, megatron), "actor", device="cpu")
    actor.init_model()
    actor.load_checkpoint(ckpt_dir)
    data = worker_data(batch, dp_rows(batch))
    out = {"log_probs": actor.compute_log_prob(data).batch["old_log_probs"]}
    out["metrics_step2"] = actor.update_policy(data)
    out["updated_step2"] = _rank0(_export(actor))
    # megatron.use_dist_checkpointing: initial weights from the checkpoint, not HF.
    ref_megatron = dict(megatron, use_dist_checkpointing=True, dist_checkpointing_path=ckpt_dir)
    ref = ActorWorker(actor_rollout_ref_config(model_path, ref_megatron), "ref", device="cpu")
    ref.init_model()
    out["ref_from_ckpt"] = ref.compute_log_prob(data).batch["ref_log_prob"]
    return out


def split_variants(model_path: str, batch: dict) -> dict:
    """One PPO step with the same mini-batch cut differently (TP=1, one process)."""
    from megarl.workers.actor import ActorWorker

    variants = {
        "micro1": dict(ppo_micro_batch_size_per_gpu=8),
        "micro4": dict(ppo_micro_batch_size_per_gpu=2),
        "dynamic": dict(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=30),
    }
    out = {}
    for name, overrides in variants.items():
        cfg = actor_rollout_ref_config(model_path, megatron_node(), **overrides)
        if name == "dynamic":
            cfg.model.use_remove_padding = True
        actor = ActorWorker(cfg, "actor", device="cpu")
        actor.init_model()
        out[name + "_metrics"] = actor.update_policy(worker_data(batch))
        out[name] = _export(actor)
    return out


# One PPO step under VPP on micro-batches of different shapes (run_schedule pads them to one):
# thd packing on 4 micro-batches (more than pp: the steady state's paired p2p), dynamic batch
# size on padded rows (3 micro-batches of 3, 2, 3 rows), and both.
VPP_VARIANTS = {
    "packed": (dict(ppo_micro_batch_size_per_gpu=2), True),
    "dynamic": (dict(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=30), False),
    "dynamic_packed": (dict(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=30), True),
}


def vpp_variants(model_path: str, batch: dict, megatron: dict) -> dict:
    """Per VPP_VARIANTS entry: metrics, the updated weights (rank 0), and the micro-batch input
    shapes run_schedule got vs the ones it gave the model (to show the padding happened); then
    one critic step with dynamic batch size and packing."""
    from megarl.workers.actor import ActorWorker
    from megarl.workers.critic import CriticWorker
    from megarl.workers.megatron import schedule

    uniform_shapes = schedule.uniform_shapes
    seen: list = []

    def recording(inputs):
        padded = uniform_shapes(inputs)
        seen.append(([tuple(x.input_ids.shape) for x in inputs], [tuple(x.input_ids.shape) for x in padded]))
        return padded

    schedule.uniform_shapes = recording
    out = {}
    for name, (overrides, remove_padding) in VPP_VARIANTS.items():
        seen.clear()
        cfg = actor_rollout_ref_config(model_path, megatron, **overrides)
        cfg.model.use_remove_padding = remove_padding
        actor = ActorWorker(cfg, "actor", device="cpu")
        actor.init_model()
        out[name + "_metrics"] = actor.update_policy(worker_data(batch))
        out[name + "_shapes"] = list(seen)
        out[name] = _rank0(_export(actor))
    # The critic with both (its values [b, s, 1] cut back like the actor's logits).
    seen.clear()
    critic = CriticWorker(critic_config(model_path, megatron, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=30,
                                        model={"override_config": {}, "use_remove_padding": True}), device="cpu")
    critic.init_model()
    out["critic_metrics"] = critic.update_critic(worker_data(batch))
    out["critic_shapes"] = list(seen)
    out["critic_values_after"] = critic.compute_values(worker_data(batch)).batch["values"]
    schedule.uniform_shapes = uniform_shapes
    return out


def offload_roundtrip(model_path: str, batch: dict) -> dict:
    """Offload everything, check storages are freed, onload, check exact restoration; a forward
    onloads the parameters alone."""
    from megarl.workers.actor import ActorWorker
    from megarl.workers.megatron.offload import PARAMS

    megatron = megatron_node(param_offload=True, optimizer_offload=True)  # param_offload: params and grads
    actor = ActorWorker(actor_rollout_ref_config(model_path, megatron), "actor", device="cpu")
    actor.init_model()

    def params_freed():
        return all(p.untyped_storage().nbytes() == 0 for c in actor.engine.chunks for p in c.parameters())

    def grads_freed():
        grad_buffers = [b.grad_data for c in actor.engine.chunks for b in c.buffers]  # DDP's contiguous grad buffers
        return bool(grad_buffers) and all(g.untyped_storage().nbytes() == 0 for g in grad_buffers)

    def optimizer_state():
        return [v for s in actor.engine.optimizer.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]

    freed_at_init = params_freed() and grads_freed()
    data = worker_data(batch)
    actor.update_policy(data)  # creates optimizer state and fills grad buffers, then offloads again
    freed_after_update = params_freed() and grads_freed() and all(v.untyped_storage().nbytes() == 0 for v in optimizer_state())
    actor.onload()
    params = [p.detach().clone() for c in actor.engine.chunks for p in c.parameters()]
    opt_state = [v.clone() for v in optimizer_state()]
    before = actor.compute_log_prob(data).batch["old_log_probs"]
    actor.offload()
    freed, grads = params_freed(), grads_freed()
    with actor._onloaded((PARAMS,)):  # what compute_log_prob does
        params_only = (not params_freed() and grads_freed()
                       and all(v.untyped_storage().nbytes() == 0 for v in optimizer_state()))
    # Methods onload around their work and re-offload afterwards.
    during = actor.compute_log_prob(data).batch["old_log_probs"]
    still_freed = params_freed()
    actor.onload()
    params_after = [p.detach().clone() for c in actor.engine.chunks for p in c.parameters()]
    opt_after = [v.clone() for v in optimizer_state()]
    return {
        "freed_at_init": freed_at_init, "freed_after_update": freed_after_update, "params_only": params_only,
        "freed": freed, "grads_freed": grads, "still_freed": still_freed, "before": before, "during": during,
        "params_equal": all(torch.equal(a, b) for a, b in zip(params, params_after)),
        "opt_equal": len(opt_state) > 0 and all(torch.equal(a, b) for a, b in zip(opt_state, opt_after)),
    }


def grad_offload_alone(model_path: str, batch: dict) -> dict:
    """verl <= 0.8's megatron.grad_offload without param_offload: the gradient buffers go to the
    host between phases, the parameters stay; an update brings them back and still trains."""
    from megarl.workers.actor import ActorWorker

    actor = ActorWorker(actor_rollout_ref_config(model_path, megatron_node(grad_offload=True)), "actor", device="cpu")
    actor.init_model()

    def sizes(tensors):
        return [t.untyped_storage().nbytes() for t in tensors]

    grads = [b.grad_data for c in actor.engine.chunks for b in c.buffers]
    params = [p for c in actor.engine.chunks for p in c.parameters()]
    before = [p.detach().clone() for p in params]
    out = {"grads_at_init": sizes(grads), "params_at_init": sizes(params)}
    actor.update_policy(worker_data(batch))
    out["grads_after_update"] = sizes(grads)
    out["trained"] = any(not torch.equal(a, p) for a, p in zip(before, params))
    return out


def padded_by_megatron_key(model_path: str, batch: dict) -> dict:
    """model.use_remove_padding=true with megatron.use_remove_padding=false (verl's Qwen3.5
    scripts): padded rows; and with both true: packed rows. Log-probs of each."""
    import dataclasses

    from megarl.workers.actor import ActorWorker

    out = {}
    for name, megatron_packs in (("padded", False), ("packed", True)):
        cfg = actor_rollout_ref_config(model_path, megatron_node(use_remove_padding=megatron_packs))
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, use_remove_padding=True))
        actor = ActorWorker(cfg, "actor", device="cpu")
        actor.init_model()
        out[f"{name}_remove_padding"] = actor.engine.remove_padding
        out[f"{name}_log_probs"] = actor.compute_log_prob(worker_data(batch)).batch["old_log_probs"]
    return out


def tp1_suite(model_path: str, batch: dict) -> dict:
    """Everything that runs at TP=1 in one process (one spawn, one megatron import)."""
    from megarl.parallel import init_distributed

    init_distributed(megatron_node(), "cpu", seed=42)
    return {
        "main": actor_and_critic(model_path, batch, megatron_node()),
        "split": split_variants(model_path, batch),
        "offload": offload_roundtrip(model_path, batch),
        "grad_offload": grad_offload_alone(model_path, batch),
        "padding": padded_by_megatron_key(model_path, batch),
    }


def trained_tp_checkpoint(model_path: str, batch: dict, megatron: dict, ckpt_dir: str) -> dict | None:
    """One PPO step, then a checkpoint in this layout; rank 0 returns the live HF export."""
    from megarl.workers.actor import ActorWorker

    actor = ActorWorker(actor_rollout_ref_config(model_path, megatron), "actor", device="cpu")
    actor.init_model()
    actor.update_policy(worker_data(batch, dp_rows(batch)))
    _allow_checkpoint_writer_processes()
    actor.save_checkpoint(ckpt_dir)
    return _rank0(_export(actor))
