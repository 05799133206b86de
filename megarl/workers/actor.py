"""Megatron actor and reference workers: log-probs, PPO policy updates, checkpoints.

One `ActorWorker` per rank (SPMD). Every method is called on every rank with that
rank's data-parallel slice (all TP/PP ranks of a DP group get the same rows). Results are
computed on the last pipeline stage and broadcast over the pipeline group, so every rank
returns the same DataProto / metrics (TP ranks agree by construction).

Config: the `actor_rollout_ref` subtree (verl names): model.{path, override_config,
use_remove_padding, enable_gradient_checkpointing, trust_remote_code}; actor.* (PPO and
optim keys, `actor.megatron`, `actor.calculate_sum_pi_squared`); ref.{log_prob_*,
megatron}; rollout.{n, temperature, log_prob_*} (the actor's old-log-prob pass uses the
rollout's log_prob_* keys, as verl).
"""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig

from megarl.algorithms import (
    combine_actor_loss,
    compute_entropy_loss,
    compute_kl_loss,
    get_policy_loss,
)
from megarl.protocol import DataProto
from megarl.workers.megatron.checkpoint import load_checkpoint, save_checkpoint
from megarl.workers.megatron.engine import MegatronEngine, MicroBatchSpec
from megarl.workers.megatron.inputs import next_token_labels, to_response
from megarl.workers.megatron.offload import Offloader
from megarl.workers.megatron.schedule import broadcast_from_last_stage
from megarl.workers.megatron.ppo_loop import (
    global_denominator,
    iterate_mini_batches,
    NonFiniteCheck,
    mean_metrics,
    mini_batch_rows,
    reduce_micro_stats,
)
from megarl.workers.megatron.vocab_parallel import vocab_parallel_log_probs_and_entropy, vocab_parallel_token_stats

__all__ = ["ActorWorker"]

_ROLES = ("actor", "ref")
# Metrics that are shares of a global-denominator loss: summed over micro-batches and DP.
_SHARE_KEYS = ("actor/pg_loss", "actor/entropy", "actor/kl_loss")


def response_mask_of(data: DataProto) -> torch.Tensor:
    """`response_mask` `[B, R]`, or the response part of attention_mask when absent."""
    if "response_mask" in data.batch.keys():
        return data.batch["response_mask"]
    response_length = data.batch["responses"].shape[1]
    return data.batch["attention_mask"][:, -response_length:]


class ActorWorker:
    """Policy (`role="actor"`) or frozen reference (`role="ref"`) on Megatron-Core.

    Args:
        config: the `actor_rollout_ref` DictConfig.
        role: "actor" (trainable, optimizer) or "ref" (eval only).
        device: "cpu" | "cuda"; default cuda when available (the trainer passes `trainer.device`).
    """

    def __init__(self, config: DictConfig, role: str = "actor", device: str | None = None) -> None:
        if role not in _ROLES:
            raise ValueError(f"ActorWorker role must be one of {_ROLES}, got {role!r}")
        self.config = config
        self.role = role
        node = config.actor if role == "actor" else config.ref
        model = config.model
        self.engine = MegatronEngine(
            node.megatron,
            model.path,
            override_config=model.get("override_config", None),
            value_head=False,
            optim_cfg=config.actor.optim if role == "actor" else None,
            remove_padding=model.get("use_remove_padding", False),
            gradient_checkpointing=model.get("enable_gradient_checkpointing", False) and role == "actor",
            trust_remote_code=model.get("trust_remote_code", False),
            prefix=f"actor_rollout_ref.{role}",
            device=device,
        )
        log_prob_node = config.rollout if role == "actor" else config.ref
        log_prob_prefix = "actor_rollout_ref.rollout." if role == "actor" else "actor_rollout_ref.ref."
        self.log_prob_spec = MicroBatchSpec(
            log_prob_node.get("log_prob_micro_batch_size_per_gpu", None),
            log_prob_node.get("log_prob_use_dynamic_bsz", False),
            log_prob_node.get("log_prob_max_token_len_per_gpu", None),
            prefix=log_prob_prefix + "log_prob_",
        )
        if role == "actor":
            actor = config.actor
            self.train_spec = MicroBatchSpec(
                actor.get("ppo_micro_batch_size_per_gpu", None),
                actor.get("use_dynamic_bsz", False),
                actor.get("ppo_max_token_len_per_gpu", None),
                prefix="actor_rollout_ref.actor.ppo_",
            )
        self.offloader: Offloader | None = None

    # ------------------------------------------------------------------ lifecycle
    def init_model(self) -> None:
        """Process groups, model chunks with HF (or dist-checkpoint) weights, optimizer."""
        self.engine.init_model()
        megatron = self.config.actor.megatron if self.role == "actor" else self.config.ref.megatron
        self.offloader = Offloader(
            self.engine,
            params=bool(megatron.get("param_offload", False)),
            grads=bool(megatron.get("grad_offload", False)),
            optimizer=bool(megatron.get("optimizer_offload", False)),
        )

    # ------------------------------------------------------------------ log-probs
    def _temperature(self, data: DataProto) -> float:
        return float(data.meta_info.get("temperature", self.config.rollout.get("temperature", 1.0)))

    def compute_log_prob(self, data: DataProto) -> DataProto:
        """Log-probs of `responses` (and entropy for the actor) under the current weights.

        Input batch: input_ids/attention_mask/position_ids `[B, P+R]`, responses `[B, R]`;
        meta_info["temperature"] (default rollout.temperature).
        Returns `old_log_probs` and `entropys` `[B, R]` (actor) or `ref_log_prob` `[B, R]`
        (ref), zero at padded response positions; meta_info["temperature"] kept. With
        `actor.calculate_sum_pi_squared` the actor also returns `sum_pi_squared` `[B, R]`
        = sum_v pi(v)^2 of softmax(logits / temperature) per token (vocab-parallel: each TP
        rank sums its vocabulary slice, one all-reduce; the optimal token baseline's input).
        """
        temperature = self._temperature(data)
        response_length = data.batch["responses"].shape[1]
        want_entropy = self.role == "actor"
        want_spp = want_entropy and bool(self.config.actor.get("calculate_sum_pi_squared", False))

        def per_micro_batch(logits, mb):
            logp, ent, spp = vocab_parallel_token_stats(
                logits, next_token_labels(mb.inputs), temperature=temperature, compute_entropy=want_entropy,
                compute_sum_pi_squared=want_spp,
            )
            out = {"log_probs": to_response(logp, mb.inputs, response_length)}
            if want_entropy:
                out["entropy"] = to_response(ent, mb.inputs, response_length)
            if want_spp:
                out["sum_pi_squared"] = to_response(spp, mb.inputs, response_length)
            return out

        with self._onloaded():
            # bf16 logits straight to the fused log-prob (it upcasts once): no fp32 logits copy
            result = self.engine.forward(data, self.log_prob_spec, (), per_micro_batch, fp32_output=False)
        mask = response_mask_of(data).to(result["log_probs"].dtype)
        if self.role == "ref":
            tensors = {"ref_log_prob": result["log_probs"] * mask}
        else:
            tensors = {"old_log_probs": result["log_probs"] * mask, "entropys": result["entropy"] * mask}
            if want_spp:
                tensors["sum_pi_squared"] = result["sum_pi_squared"] * mask
        return DataProto.from_dict(tensors, meta_info={"temperature": temperature})

    # ------------------------------------------------------------------ PPO update
    def update_policy(self, data: DataProto) -> dict[str, float]:
        """PPO: ppo_epochs x mini-batches x micro-batches (gradient accumulation).

        Input batch: input_ids/attention_mask/position_ids, responses, response_mask,
        old_log_probs, advantages (`[B, R]`), ref_log_prob when actor.use_kl_loss,
        optional rollout_is_weights. Losses come from megarl.algorithms with a global
        denominator (valid tokens / sequences of the whole mini-batch over all
        micro-batches and DP ranks), so the split into micro-batches / DP ranks does not
        change the gradient.

        Returns metrics averaged over mini-batches: actor/pg_loss, pg_clipfrac,
        pg_clipfrac_lower, ppo_kl, entropy (when entropy_coeff != 0, as verl), kl_loss (when
        use_kl_loss), grad_norm, lr.

        NaN/Inf loss or grad norm in a mini-batch step (never applied to the weights):
        meta_info["nan_policy"] "stop" (default) raises NonFiniteError naming
        meta_info["global_step"] and phase update_actor; "skip" drops that step and reports
        actor/nonfinite_skipped_steps.
        """
        if self.role != "actor":
            raise RuntimeError("update_policy is only available for role='actor'")
        actor = self.config.actor
        temperature = self._temperature(data)
        response_length = data.batch["responses"].shape[1]
        loss_agg_mode = actor.get("loss_agg_mode", "token-mean")
        policy_loss_fn = get_policy_loss(actor.get("policy_loss", {}).get("loss_mode", "vanilla"))
        entropy_coeff = float(actor.get("entropy_coeff", 0.0))
        use_kl_loss = bool(actor.get("use_kl_loss", False))
        kl_loss_coef = float(actor.get("kl_loss_coef", 0.0))
        kl_loss_type = actor.get("kl_loss_type", "low_var_kl")
        loss_scale_factor = actor.get("loss_scale_factor", None)

        batch = data.batch
        tensors = {"response_mask": response_mask_of(data)}
        for key in ("old_log_probs", "advantages") + (("ref_log_prob",) if use_kl_loss else ()):
            if key not in batch.keys():
                hint = " (actor.use_kl_loss needs the reference log-probs)" if key == "ref_log_prob" else ""
                raise KeyError(f"update_policy: the batch lacks {key!r}{hint}")
            tensors[key] = batch[key]
        if "rollout_is_weights" in batch.keys():
            tensors["rollout_is_weights"] = batch["rollout_is_weights"]
        model_tensors = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids", "responses")}
        work = DataProto.from_dict({**model_tensors, **tensors})

        rows = mini_batch_rows(actor.ppo_mini_batch_size, self.config.rollout.get("n", 1), len(work), "actor_rollout_ref.actor")
        epochs = int(actor.get("ppo_epochs", 1))
        nan_check = NonFiniteCheck(data.meta_info, "actor_rollout_ref.actor", "update_actor", epochs * (len(work) // rows))
        steps = []
        with self._onloaded():
            for index in iterate_mini_batches(
                len(work), rows, epochs, actor.get("shuffle", False), actor.get("data_loader_seed", 0) or 0
            ):
                mini = work[index]
                denominator = global_denominator(mini.batch["response_mask"])
                micro, _ = self.engine.micro_batches(mini, self.train_spec, tuple(tensors))

                def loss_fn(logits, mb, denominator=denominator):
                    t = mb.tensors
                    mask = t["response_mask"]
                    # As verl: the entropy (2 more passes over the [tokens, V/tp] logits
                    # and a second fp32 buffer) only when it is part of the loss.
                    logp, ent = vocab_parallel_log_probs_and_entropy(
                        logits, next_token_labels(mb.inputs), temperature=temperature,
                        compute_entropy=entropy_coeff != 0,
                    )
                    log_prob = to_response(logp, mb.inputs, response_length)
                    pg_loss, stats = policy_loss_fn(
                        t["old_log_probs"], log_prob, t["advantages"], mask, loss_agg_mode,
                        config=actor, global_denominator=denominator,
                        rollout_is_weights=t.get("rollout_is_weights"),
                    )
                    entropy_loss = None
                    if ent is not None:
                        entropy = to_response(ent, mb.inputs, response_length)
                        entropy_loss = compute_entropy_loss(entropy, mask, loss_agg_mode, denominator, loss_scale_factor)
                        stats["actor/entropy"] = entropy_loss.item()
                    kl_loss = None
                    if use_kl_loss:
                        kl_loss, _ = compute_kl_loss(
                            log_prob, t["ref_log_prob"], mask, kl_loss_type, loss_agg_mode, denominator, loss_scale_factor
                        )
                        stats["actor/kl_loss"] = kl_loss.item()
                    loss = combine_actor_loss(pg_loss, entropy_loss, entropy_coeff, kl_loss, kl_loss_coef)
                    stats["actor/pg_loss"] = pg_loss.item()
                    return loss, stats

                micro_stats, grad_norm, lr = self.engine.train_step(micro, loss_fn, fp32_output=False)
                step = reduce_micro_stats(micro_stats, _SHARE_KEYS)
                step.update({"actor/grad_norm": grad_norm, "actor/lr": lr})
                if not nan_check.drop(step, self.engine.optimizer):
                    steps.append(step)
        self.engine.step_scheduler()
        return broadcast_from_last_stage({**mean_metrics(steps), **nan_check.metrics("actor")})

    # ------------------------------------------------------------------ weights / state
    def save_checkpoint(self, path: str, global_step: int = 0) -> None:
        """Megatron dist checkpoint of model, optimizer, lr scheduler and RNG (see checkpoint.py)."""
        contents = self.config.actor.get("checkpoint", {}).get("save_contents", ["model", "optimizer", "extra"])
        with self._onloaded():
            save_checkpoint(self.engine, path, contents=list(contents), global_step=global_step)

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        """Restore what `save_checkpoint` wrote (any TP/PP layout); returns its metadata."""
        contents = self.config.actor.get("checkpoint", {}).get("load_contents", ["model", "optimizer", "extra"])
        with self._onloaded():
            return load_checkpoint(self.engine, path, contents=list(contents))

    def export_hf_weights(self):
        """Iterator of (hf_name, full tensor); collective over the model-parallel group."""
        return self.engine.export_hf_weights()

    def offload(self) -> None:
        """Move the configured state (megatron.param/grad/optimizer_offload) to CPU."""
        if self.offloader is not None:
            self.offloader.offload()

    def onload(self) -> None:
        """Bring offloaded state back to the training device."""
        if self.offloader is not None:
            self.offloader.onload()

    def _onloaded(self):
        return self.offloader.onloaded() if self.offloader is not None else _nullcontext()


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
