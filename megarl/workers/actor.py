"""Megatron actor and reference workers: log-probs, PPO policy updates, checkpoints.

One `ActorWorker` per rank (SPMD). Every method is called on every rank with that
rank's data-parallel slice (all TP/PP ranks of a DP group get the same rows). Results are
computed on the last pipeline stage and broadcast over the pipeline group, so every rank
returns the same DataProto / metrics (TP ranks agree by construction).

Config: the typed `actor_rollout_ref` section (`ActorRolloutRefConfig`, verl names): model.{path, override_config,
use_remove_padding, trust_remote_code, lora (the actor's adapters; with them the reference is this
model with its adapters off, `compute_ref_log_prob`)}; actor.* (PPO and
optim keys, `actor.megatron`, `actor.calculate_sum_pi_squared`); ref.{log_prob_*,
megatron}; rollout.{n, temperature, log_prob_*} (the actor's old-log-prob pass uses the
rollout's log_prob_* keys, as verl).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

from megarl.algorithms import (
    combine_actor_loss,
    compute_entropy_loss,
    compute_kl_loss,
    get_policy_loss,
)
from megarl.algorithms.distillation import combine_with_policy_loss, distillation_objective, estimator_losses
from megarl.config.read import replaced
from megarl.config.schema.actor import ActorRolloutRefConfig
from megarl.config.schema.algorithm import RolloutCorrectionConfig
from megarl.config.schema.distillation import DistillationConfig
from megarl.models.lora import adapters_disabled
from megarl.protocol import DataProto
from megarl.utils.fault_points import rank_pause_point
from megarl.workers.megatron.engine import MicroBatchSpec
from megarl.workers.megatron.inputs import next_token_labels, response_mask_of, response_values, to_response
from megarl.workers.megatron.offload import PARAMS
from megarl.workers.megatron.ppo_loop import run_ppo_update, update_inputs
from megarl.workers.megatron.router_replay import RECORD, REPLAY
from megarl.workers.megatron.vocab_parallel import vocab_parallel_log_probs_and_entropy, vocab_parallel_token_stats
from megarl.workers.megatron.vocab_topk import vocab_parallel_forward_kl_topk
from megarl.workers.megatron.worker_base import MegatronWorker

__all__ = ["ActorWorker"]

_ROLES = ("actor", "ref")
# Metrics that are shares of a global-denominator loss: summed over micro-batches and DP.
_SHARE_KEYS = ("actor/pg_loss", "actor/entropy", "actor/kl_loss", "distillation/loss")


class ActorWorker(MegatronWorker):
    """Policy (`role="actor"`) or frozen reference (`role="ref"`) on Megatron-Core.

    Args:
        config: the `actor_rollout_ref` node.
        role: "actor" (trainable, optimizer) or "ref" (eval only).
        device: "cpu" | "cuda"; default cuda when available (the trainer passes `trainer.device`).
        rollout_correction: `algorithm.rollout_correction`, which the policy loss
            `actor.policy_loss.loss_mode=bypass_mode` reads (its IS / rejection keys and
            loss_type); only that loss mode needs it.
        distillation: the `distillation` section when enabled: the teacher's log-probs in the batch
            (megarl.workers.teacher) give a per-token loss joined to the policy loss
            (megarl.algorithms.distillation); None = no distillation.
    """

    def __init__(
        self,
        config: ActorRolloutRefConfig,
        role: str = "actor",
        device: str | None = None,
        rollout_correction: RolloutCorrectionConfig | None = None,
        distillation: DistillationConfig | None = None,
    ) -> None:
        if role not in _ROLES:
            raise ValueError(f"ActorWorker role must be one of {_ROLES}, got {role!r}")
        self.config = config
        self.role = role
        self.rollout_correction = rollout_correction
        self.distillation = distillation
        trainable = role == "actor"
        node = config.actor if trainable else config.ref
        self.replay_mode = node.megatron.router_replay.mode  # disabled | R2 | R3 (megarl.workers.megatron.router_replay)
        self._health_seen = False  # this step's moe/* metrics came from an old-log-prob pass
        super().__init__(
            config.model, node.megatron, config.actor.optim if trainable else None, config.actor.checkpoint,
            value_head=False, prefix=f"actor_rollout_ref.{role}", device=device, nccl_timeout_s=config.nccl_timeout,
            lora_cfg=config.model.lora if trainable else None, routing_replay=self.replay_mode != "disabled",
        )
        # the old-log-prob pass uses the rollout's log_prob_* keys (verl), the reference its own
        log_prob_node, log_prob_path = (config.rollout, "rollout") if trainable else (config.ref, "ref")
        self.log_prob_spec = MicroBatchSpec(
            log_prob_node.log_prob_micro_batch_size_per_gpu,
            log_prob_node.log_prob_use_dynamic_bsz,
            log_prob_node.log_prob_max_token_len_per_gpu,
            micro_batch_key=f"actor_rollout_ref.{log_prob_path}.log_prob_micro_batch_size_per_gpu",
            max_token_len_key=f"actor_rollout_ref.{log_prob_path}.log_prob_max_token_len_per_gpu",
        )
        if trainable:
            self.train_spec = MicroBatchSpec.for_ppo(config.actor, "actor_rollout_ref.actor")
        if self.uses_lora:  # the reference is this model without adapters (verl's ref_in_actor)
            self.ref_log_prob_spec = MicroBatchSpec(
                config.ref.log_prob_micro_batch_size_per_gpu, config.ref.log_prob_use_dynamic_bsz,
                config.ref.log_prob_max_token_len_per_gpu,
                micro_batch_key="actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
                max_token_len_key="actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
            )

    @property
    def uses_lora(self) -> bool:
        """LoRA adapters train on a frozen base (actor_rollout_ref.model.lora.rank > 0)."""
        return self.engine.lora is not None

    # ------------------------------------------------------------------ log-probs
    def _temperature(self, data: DataProto) -> float:
        """The rollout's temperature (meta_info["temperature"]), else rollout.temperature."""
        if "temperature" in data.meta_info:
            return float(data.meta_info["temperature"])
        return float(self.config.rollout.temperature)

    def compute_log_prob(self, data: DataProto) -> DataProto:
        """Log-probs of `responses` (and entropy for the actor) under the current weights.

        Input batch: input_ids/attention_mask/position_ids `[B, P+R]`, responses `[B, R]`;
        meta_info["temperature"] (default rollout.temperature).
        Returns `old_log_probs` and `entropys` `[B, R]` (actor) or `ref_log_prob` `[B, R]`
        (ref), zero at padded response positions; meta_info["temperature"] kept. With
        `actor.calculate_sum_pi_squared` the actor also returns `sum_pi_squared` `[B, R]`
        = sum_v pi(v)^2 of softmax(logits / temperature) per token (vocab-parallel: each TP
        rank sums its vocabulary slice, one all-reduce; the optimal token baseline's input).

        MoE routing replay (the role's ``megatron.router_replay.mode``): R3 replays the batch's
        ``routed_experts`` ``[B, P+R, MoE layers, top-k]`` (vLLM's), as does the reference under R2 (the
        actor's); the actor's R2 pass records its own and returns them as ``routed_experts``. meta_info
        ["metrics"] then has ``router_replay/{old_log_prob,ref}/{native_frac,differs_frac}``. The actor's pass
        of an MoE model adds the step's ``moe/*`` health metrics (megarl.workers.megatron.moe_health).
        """
        return self._log_probs(data, reference=self.role == "ref")

    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """LoRA's reference: `ref_log_prob` `[B, R]` of the base model (this model with its
        adapters off; no second model), micro-batched by the ref's log_prob_* keys."""
        if not self.uses_lora:
            raise RuntimeError("compute_ref_log_prob on the actor needs LoRA (actor_rollout_ref.model.lora.rank > 0); "
                               "otherwise the reference is its own model (role='ref')")
        with adapters_disabled(self.engine.chunks):
            return self._log_probs(data, reference=True)

    @contextlib.contextmanager
    def _routing(self, routing: str | None, data: DataProto, name: str) -> Iterator[dict[str, float]]:
        """A pass whose MoE routers replay or record (``routing``; None: they choose); the dict it yields gets the
        pass's ``router_replay/<name>/*`` metrics (replays only) when the block ends."""
        metrics: dict[str, float] = {}
        if routing is None:
            yield metrics
            return
        if routing == REPLAY and "routed_experts" not in data.batch.keys():
            why = ("the old-log-prob pass records them (actor_rollout_ref.actor.megatron.router_replay.mode=R2)"
                   if self.replay_mode == "R2" else
                   "the rollout records them with actor_rollout_ref.rollout.enable_rollout_routing_replay=true")
            raise KeyError(f"actor_rollout_ref.{self.role}.megatron.router_replay.mode={self.replay_mode}: the batch lacks "
                           f"routed_experts to replay ({why})")
        replay = self.engine.router_replay
        replay.begin(routing)
        try:
            yield metrics
        except BaseException:
            replay.disarm(self.engine.chunks)
            raise
        shares = replay.end(self.engine.chunks)
        if routing == REPLAY:
            metrics.update({f"router_replay/{name}/{key}": value for key, value in shares.items()})

    @contextlib.contextmanager
    def _health(self, wanted: bool) -> Iterator[dict[str, float]]:
        """A pass whose MoE routers are observed (megarl.workers.megatron.moe_health) when ``wanted`` and the model
        is MoE; the dict it yields gets the ``moe/*`` metrics when the block ends."""
        metrics: dict[str, float] = {}
        health = self.engine.moe_health if wanted else None
        if health is None:
            yield metrics
            return
        health.begin()
        try:
            yield metrics
        except BaseException:
            health.active = False
            raise
        metrics.update(health.end())
        self._health_seen = True

    def _log_prob_routing(self, reference: bool) -> str | None:
        """The routing of a log-prob pass: the actor's old-log-prob pass replays (R3) or records (R2), the
        reference model's replays (R2: what the actor recorded; R3: vLLM's)."""
        if self.replay_mode == "disabled" or (reference and self.role == "actor"):
            return None
        return RECORD if self.replay_mode == "R2" and not reference else REPLAY

    def _log_probs(self, data: DataProto, *, reference: bool) -> DataProto:
        temperature = self._temperature(data)
        response_length = data.batch["responses"].shape[1]
        want_entropy = not reference
        want_spp = want_entropy and bool(self.config.actor.calculate_sum_pi_squared)

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

        routing = self._log_prob_routing(reference)
        recorded = None
        with (self._onloaded((PARAMS,)), self._routing(routing, data, "ref" if reference else "old_log_prob") as metrics,
              self._health(not reference) as health):
            # a forward needs neither gradients nor optimizer state; bf16 logits straight to the fused
            # log-prob (it upcasts once): no fp32 logits copy
            spec = self.ref_log_prob_spec if reference and self.role == "actor" else self.log_prob_spec
            result = self.engine.forward(data, spec, (), per_micro_batch, fp32_output=False, routing=routing)
            if routing == RECORD:
                recorded = self.engine.router_replay.recorded(len(data), data.batch["input_ids"].shape[1])
        metrics.update(health)
        mask = response_mask_of(data).to(result["log_probs"].dtype)
        if reference:
            tensors = {"ref_log_prob": result["log_probs"] * mask}
        else:
            tensors = {"old_log_probs": result["log_probs"] * mask, "entropys": result["entropy"] * mask}
            if want_spp:
                tensors["sum_pi_squared"] = result["sum_pi_squared"] * mask
        if recorded is not None:
            tensors["routed_experts"] = recorded
        meta = {"temperature": temperature, **({"metrics": metrics} if metrics else {})}
        return DataProto.from_dict(tensors, meta_info=meta)

    # ------------------------------------------------------------------ PPO update
    def _policy_loss_fn(self, loss_mode: str):
        """The registered policy loss; bypass_mode gets `algorithm.rollout_correction` bound."""
        fn = get_policy_loss(loss_mode)
        if loss_mode != "bypass_mode":
            return fn
        if self.rollout_correction is None:
            raise ValueError(
                "actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode reads algorithm.rollout_correction: "
                "construct the actor worker with rollout_correction=<typed algorithm.rollout_correction> "
                "(RayPPOTrainer does)"
            )
        return functools.partial(fn, rollout_correction=self.rollout_correction)

    def _distillation_loss(self, logits, mb, log_prob, temperature: float, denominator):
        """This micro-batch's share of the distillation loss and its metrics: per-token losses
        `[b, R]` from the teacher's log-probs in `mb.tensors` (estimator: the sampled token's
        `teacher_logprobs` `[b, R]`; forward_kl_topk: `teacher_logprobs` / `teacher_ids` `[b, R, k]`
        against the student's vocab-parallel logits), then `distillation_objective`."""
        actor, loss_cfg = self.config.actor, self.distillation.distillation_loss
        t = mb.tensors
        mask = t["response_mask"]
        stats = {}
        if self.distillation.uses_topk():
            response_logits = response_values(logits, mb.inputs, log_prob.shape[1])  # [b, R, vocab / tp]
            kl, student_mass, teacher_mass = vocab_parallel_forward_kl_topk(
                response_logits, t["teacher_logprobs"], t["teacher_ids"], temperature=temperature,
                log_prob_min_clamp=loss_cfg.log_prob_min_clamp,
            )
            token_losses = kl.clamp_min(0.0)  # top-k mass below 1 can make the sum negative (verl clamps too)
            valid = mask.bool()
            stats["distillation/student_mass"] = student_mass[valid].mean().item() if valid.any() else 0.0
            stats["distillation/teacher_mass"] = teacher_mass[valid].mean().item() if valid.any() else 0.0
        else:
            token_losses = estimator_losses(log_prob, t["teacher_logprobs"], loss_cfg.loss_mode)
        pg_config = replaced(actor, clip_ratio=loss_cfg.clip_ratio, clip_ratio_low=loss_cfg.clip_ratio_low,
                             clip_ratio_high=loss_cfg.clip_ratio_high)
        loss, objective_stats = distillation_objective(
            token_losses, mask, loss_cfg, actor.loss_agg_mode, denominator, pg_config=pg_config,
            old_log_prob=t["old_log_probs"], log_prob=log_prob, rollout_is_weights=t.get("rollout_is_weights"),
        )
        stats.update(objective_stats)
        stats["distillation/loss"] = loss.item()
        return loss, stats

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
        use_kl_loss), grad_norm, lr; with routing replay (R2 / R3: every forward replays the batch's
        ``routed_experts``) ``router_replay/update/{native_frac,differs_frac}``; an MoE model's ``moe/*``
        health metrics over the update's forwards when no old-log-prob pass ran since the last update.

        NaN/Inf loss or grad norm in a mini-batch step (never applied to the weights):
        meta_info["nan_policy"] (required; the trainer sets trainer.nan_policy) "stop" raises NonFiniteError naming
        meta_info["global_step"] and phase update_actor; "skip" drops that step and reports
        actor/nonfinite_skipped_steps.
        """
        if self.role != "actor":
            raise RuntimeError("update_policy is only available for role='actor'")
        actor = self.config.actor
        temperature = self._temperature(data)
        response_length = data.batch["responses"].shape[1]
        loss_agg_mode = actor.loss_agg_mode
        policy_loss_fn = self._policy_loss_fn(actor.policy_loss.loss_mode)
        entropy_coeff = float(actor.entropy_coeff)
        use_kl_loss = bool(actor.use_kl_loss)
        kl_loss_coef = float(actor.kl_loss_coef)
        kl_loss_type = actor.kl_loss_type
        loss_scale_factor = actor.loss_scale_factor
        distil = self.distillation
        teacher_keys = () if distil is None else ("teacher_logprobs",) + (("teacher_ids",) if distil.uses_topk() else ())
        tensors = update_inputs(
            data, ("old_log_probs", "advantages") + (("ref_log_prob",) if use_kl_loss else ()) + teacher_keys,
            ("rollout_is_weights",), method="update_policy",
            hints={"ref_log_prob": "actor.use_kl_loss needs the reference log-probs",
                   "teacher_logprobs": "distillation.enabled needs the teacher's log-probs (TeacherWorker)",
                   "teacher_ids": "forward_kl_topk needs the teacher's top-k ids (TeacherWorker)"},
        )

        def make_loss_fn(denominator):
            def loss_fn(logits, mb):
                rank_pause_point("update_microbatch")
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
                if distil is not None:
                    distil_loss, distil_stats = self._distillation_loss(logits, mb, log_prob, temperature, denominator)
                    loss = combine_with_policy_loss(loss, distil_loss, distil.distillation_loss)
                    stats.update(distil_stats)
                return loss, stats

            return loss_fn

        routing = None if self.replay_mode == "disabled" else REPLAY  # R2 / R3: the batch's routed_experts
        # the step's MoE health comes from its old-log-prob pass; without one (rollout-correction bypass) from here
        with (self._onloaded(), self._routing(routing, data, "update") as replay_metrics,
              self._health(not self._health_seen) as health):
            # bf16 logits straight to the fused log-prob, as in compute_log_prob
            metrics = run_ppo_update(
                self.engine, data, tensors, make_loss_fn, self.train_spec,
                mini_batch_size=actor.ppo_mini_batch_size, rollout_n=self.config.actor.rollout_n,
                ppo_epochs=actor.ppo_epochs, shuffle=actor.shuffle, seed=actor.data_loader_seed,
                prefix="actor_rollout_ref.actor", phase="update_actor", metric_prefix="actor",
                share_keys=_SHARE_KEYS, fp32_output=False, routing=routing,
            )
        self._health_seen = False
        return {**metrics, **replay_metrics, **health}
