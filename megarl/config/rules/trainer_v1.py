"""trainer.v1 rules: what each of verl's V1 trainer modes needs, refused by key before any worker
starts where megarl cannot honour it (megarl.trainer.v1 runs the modes)."""

from __future__ import annotations

import math
from collections.abc import Iterator

from megarl.config.errors import Issue
from megarl.config.rules.view import View

_V1 = "trainer.v1"
_R = "actor_rollout_ref.rollout"


def _mode(v: View) -> str:
    return v.get(f"{_V1}.trainer_mode") if v.get("trainer.use_v1") else "sync"


def warmup_within_threshold(v: View) -> Iterator[Issue]:
    """Prompts admitted `num_warmup_batches` ahead of training are trained that many versions later:
    more than `max_off_policy_threshold - 1` would be stale on arrival (verl drops them every step)."""
    mode = _mode(v)
    threshold = v.get(f"{_V1}.sampler.max_off_policy_threshold")
    if mode == "sync" or threshold is None:
        return
    key = f"{_V1}.{mode}.num_warmup_batches"
    warmup = v.get(key)
    if math.ceil(warmup) > threshold - 1:
        yield Issue(key, warmup,
                    f"prompts admitted {warmup} batches ahead would be trained {math.ceil(warmup)} policy versions after "
                    f"they were generated, beyond {_V1}.sampler.max_off_policy_threshold={threshold} (at most "
                    f"{threshold - 1} versions of staleness)",
                    f"set {key} <= {threshold - 1}, or {_V1}.sampler.max_off_policy_threshold >= {math.ceil(warmup) + 1}")


def async_needs(v: View) -> Iterator[Issue]:
    """The async modes run per-request agent loops, score the batch on the controller and take one
    batch of prompts at a time."""
    mode = _mode(v)
    if mode == "sync":
        return
    why = f"with {_V1}.trainer_mode={mode}"
    if v.get(f"{_R}.mode") != "async":
        yield Issue(f"{_R}.mode", v.get(f"{_R}.mode"), f"{why} generation must be resumable per request (partial rollout)",
                    f"set {_R}.mode=async")
    if v.get("algorithm.filter_groups.enable"):
        yield Issue("algorithm.filter_groups.enable", True, f"not implemented {why} in megarl",
                    f"set algorithm.filter_groups.enable=false or {_V1}.trainer_mode=sync")
    if v.get("algorithm.adv_estimator") == "remax":
        yield Issue("algorithm.adv_estimator", "remax", f"ReMax's greedy baseline per step is not implemented {why}",
                    f"use another estimator or {_V1}.trainer_mode=sync")
    if v.get("reward.launch_reward_fn_async"):
        yield Issue("reward.launch_reward_fn_async", True,
                    f"{why} the batch is scored on the controller when it is formed (streamed scoring in the rollout "
                    "worker is not implemented there)", f"set reward.launch_reward_fn_async=false or {_V1}.trainer_mode=sync")
    if v.get(f"{_R}.enable_rollout_routing_replay"):
        yield Issue(f"{_R}.enable_rollout_routing_replay", True,
                    f"{why} a request interrupted by a weight update resumes under new weights, and megarl's partial "
                    "rollout does not carry the routes vLLM recorded before the interruption",
                    f"set {_R}.enable_rollout_routing_replay=false (router_replay.mode=R2 records the old-log-prob pass's "
                    f"routes instead) or {_V1}.trainer_mode=sync")


def separate_placement(v: View) -> Iterator[Issue]:
    """separate_async: the engines' own pool (verl asserts nnodes, n_gpus_per_node > 0 and a non-naive
    checkpoint engine); no rollout replicas on the trainer's GPUs; elsewhere no standalone pool."""
    mode = _mode(v)
    nnodes, per_node = v.get(f"{_R}.nnodes"), v.get(f"{_R}.n_gpus_per_node")
    if mode != "separate_async":
        if nnodes:
            yield Issue(f"{_R}.nnodes", nnodes, f"the standalone rollout pool exists only with {_V1}.trainer_mode=separate_async",
                        f"set {_R}.nnodes=0, or {_V1}.trainer_mode=separate_async")
        if not v.get("actor_rollout_ref.hybrid_engine"):
            yield Issue("actor_rollout_ref.hybrid_engine", False,
                        f"not supported with {_V1}.trainer_mode={mode}: the actor, reference and rollout share each rank "
                        "(hybrid engine); only separate_async places the engines elsewhere",
                        f"set actor_rollout_ref.hybrid_engine=true, or {_V1}.trainer_mode=separate_async")
        return
    if nnodes < 1:
        yield Issue(f"{_R}.nnodes", nnodes, "separate_async needs a standalone rollout pool (verl asserts nnodes > 0)",
                    f"set {_R}.nnodes >= 1 and {_R}.n_gpus_per_node to the engines' GPUs per node")
    if v.get("actor_rollout_ref.hybrid_engine"):
        yield Issue("actor_rollout_ref.hybrid_engine", True,
                    "with separate_async verl also builds rollout replicas on the trainer's GPUs (for the warm-up and "
                    "validation); megarl's separate_async generates on the standalone pool only",
                    "set actor_rollout_ref.hybrid_engine=false")
    backend = v.get(f"{_R}.checkpoint_engine.backend")
    if backend != "nccl":
        yield Issue(f"{_R}.checkpoint_engine.backend", backend,
                    "separate_async pushes the weights to its engines over a process group (verl asserts a non-naive backend)",
                    f"set {_R}.checkpoint_engine.backend=nccl (gloo is used with trainer.device=cpu)")
    tp = v.get(f"{_R}.tensor_model_parallel_size")
    if tp != 1:
        yield Issue(f"{_R}.tensor_model_parallel_size", tp, "separate_async runs one engine per GPU of the rollout pool "
                    "(tensor-parallel standalone engines are not implemented)",
                    f"set {_R}.tensor_model_parallel_size=1 (more engines: raise {_R}.n_gpus_per_node)")
    if v.get("reward.reward_model.enable"):
        yield Issue("reward.reward_model.enable", True, "verl's separate_async needs the reward model in its own pool "
                    "(reward.reward_model.enable_resource_pool), which megarl does not implement",
                    f"use a rule or custom reward, or {_V1}.trainer_mode=colocate_async")
    sync_step = v.get(f"{_V1}.separate_async.parameter_sync_step")
    batch, mini = v.get("data.train_batch_size"), v.get("actor_rollout_ref.actor.ppo_mini_batch_size")
    if batch != sync_step * mini:
        yield Issue(f"{_V1}.separate_async.parameter_sync_step", sync_step,
                    f"verl requires data.train_batch_size ({batch}) = parameter_sync_step x "
                    f"actor_rollout_ref.actor.ppo_mini_batch_size ({mini}): the mini-batch updates between two weight pushes",
                    f"set {_V1}.separate_async.parameter_sync_step={batch // mini if batch % mini == 0 else '<train_batch_size / ppo_mini_batch_size>'}")


RULES = (warmup_within_threshold, async_needs, separate_placement)
