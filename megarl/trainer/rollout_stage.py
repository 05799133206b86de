"""The rollout stage of a PPO step: generation and rewards of every kind, one scored batch out.

    prompts -> the actor's weights into the engines when they changed (phase ``weight_sync``: the
         colocated sync, or with trainer.v1 separate_async the push to the standalone engines)
      -> rollout.n responses per prompt (vLLM, phase ``gen``; with the async trainer modes the batch
         the sampler forms from the groups the engines finished, megarl.trainer.v1.sampler)
      [ReMax: one greedy response per prompt, scored: ``reward_baselines`` (phase ``gen_max``)]
      -> rewards, one of
         * the rule / custom reward manager here (phase ``reward``);
         * the learned reward model's worker group (phase ``reward_model``; its score replaces the
           rule reward, as in verl);
         * streamed: scored in the rollout workers as each sample's agent loop returns
           (reward.launch_reward_fn_async with rollout.mode=async, megarl.reward.streaming);
         * in a background thread while the trainer runs the log-prob and value passes
           (reward.launch_reward_fn_async otherwise), collected by :meth:`RolloutStage.finish`
           (phase ``reward_wait``);
      [algorithm.filter_groups: keep the groups whose metric varies, generate again until full]
      -> reordered to balance the data-parallel ranks (trainer.balance_batch)

A scoring call cut by reward.timeout scores 0.0 and is counted (``reward/timeouts``). Validation
batches are generated and scored here too (:meth:`RolloutStage.validation_batch`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from megarl.algorithms import filter_groups, filter_metric_values, needs_greedy_baselines
from megarl.config.schema.root import MegaRLConfig
from megarl.protocol import DataProto
from megarl.reward.extra_metrics import extra_metrics
from megarl.reward.managers import make_reward_manager, place_scores, reward_spec
from megarl.reward.rm_inputs import rm_inputs
from megarl.trainer.balance import balance_order
from megarl.trainer.metrics import generation_metrics, mean_metrics
from megarl.trainer.worker_group import WorkerGroup

if TYPE_CHECKING:
    from megarl.trainer.v1.sampler import AsyncSampler
    from megarl.trainer.v1.standalone_engines import StandaloneEngines

Phase = Callable[..., AbstractContextManager]  # phase(name, timings): the trainer's named, timed phase
Scores = tuple[torch.Tensor, dict[str, list[Any]]]  # token_level_scores [B, R], reward extras per row
_EXTRA = "reward_extra/"


class RolloutStage:
    """Generation and reward for the trainer; built before Ray starts (the reward manager forks its
    scoring processes in :meth:`start`), given its worker groups by :meth:`attach`.

    Args:
        cfg: the run's typed config.
        tokenizer: the data tokenizer (decodes responses for the scorers and the reward model).
        phase: the trainer's ``phase(name, timings)`` context (names the phase a failure happens in).
    """

    def __init__(self, cfg: MegaRLConfig, tokenizer: Any, phase: Phase) -> None:
        self.tokenizer = tokenizer
        self.phase = phase
        self.algorithm = cfg.algorithm
        self.balance_batch = bool(cfg.trainer.balance_batch)
        self.val_do_sample = bool(cfg.actor_rollout_ref.rollout.val_kwargs.do_sample)
        spec = reward_spec(cfg)
        self.reward_fn = make_reward_manager(spec, tokenizer)
        rm = cfg.reward.reward_model
        self.rm_max_length = rm.rollout.max_length()
        self.rm_tokenizer = None
        if rm.enable:  # its score replaces the rule reward (verl's reward loop without a custom function)
            from transformers import AutoTokenizer

            self.rm_tokenizer = AutoTokenizer.from_pretrained(rm.model_path)
        # reward.launch_reward_fn_async: with rollout.mode=async (per-row managers) the rollout workers
        # score each training sample as its agent loop returns, overlapping reward with generation;
        # otherwise score in a background thread while the log-prob / value passes run on the workers
        # (not with filter_groups, which needs the scores before them).
        launch_async = cfg.reward.launch_reward_fn_async
        self.stream_spec = spec if launch_async and cfg.actor_rollout_ref.rollout.mode == "async" and spec.name != "batch" else None
        self.filter_groups = cfg.algorithm.filter_groups
        self.reward_pool = (ThreadPoolExecutor(max_workers=1, thread_name_prefix="megarl-reward")
                            if launch_async and self.stream_spec is None and not self.filter_groups.enable else None)
        self.actor: WorkerGroup | None = None
        self.reward_model: WorkerGroup | None = None
        self.engines: StandaloneEngines | None = None
        self._pending: Future[Scores] | None = None
        self._timeouts = 0  # scoring calls cut by reward.timeout since the step began
        self._named_extras: set[str] = set()  # non-numeric reward dict keys, printed once (extra_metrics)

    @property
    def uses_reward_model(self) -> bool:
        """reward.reward_model.enable: the trainer builds the reward model's worker group."""
        return self.rm_tokenizer is not None

    @property
    def reward_fn_key(self) -> str:
        """The non-tensor column naming each row's data source (``data.reward_fn_key``)."""
        return self.reward_fn.reward_fn_key

    def start(self) -> None:
        self.reward_fn.start()

    def attach(self, actor: WorkerGroup, reward_model: WorkerGroup | None,
               engines: StandaloneEngines | None = None) -> None:
        """The worker groups that generate (actor/rollout, or with separate_async the standalone
        ``engines``) and score (the reward model, if any)."""
        self.actor, self.reward_model, self.engines = actor, reward_model, engines

    def close(self) -> None:
        if self.reward_pool is not None:
            self.reward_pool.shutdown(wait=False)
        self.reward_fn.close()

    # ------------------------------------------------------------------ training
    def run(self, prompts: DataProto, more_prompts: Iterator[DataProto], step: int,
            timings: dict[str, float]) -> tuple[DataProto, dict[str, float]]:
        """The step's batch and its rollout metrics. Scored unless the scores come from the
        background thread (then :meth:`finish` sets them); with algorithm.filter_groups, more
        prompts are drawn from ``more_prompts`` until the batch is full."""
        self._timeouts = 0
        metrics: dict[str, float] = {}
        batch = self._generate(prompts, step, timings, metrics)
        return self._scored(batch, more_prompts, step, timings, metrics)

    def run_async(self, sampler: AsyncSampler, step: int, timings: dict[str, float]) -> tuple[DataProto, dict[str, float]]:
        """The async trainer modes: the batch the sampler forms for ``step`` (admission, generation,
        megarl.trainer.v1.sampler), scored as :meth:`run` scores."""
        self._timeouts = 0
        metrics: dict[str, float] = {}
        self._sync_weights(step - 1, timings, metrics)
        with self.phase("gen", timings):
            batch = sampler.next_batch(step, metrics)
        metrics.update(_gen_metrics(batch))
        return self._scored(batch, iter(()), step, timings, metrics)

    def _scored(self, batch: DataProto, more_prompts: Iterator[DataProto], step: int, timings: dict[str, float],
                metrics: dict[str, float]) -> tuple[DataProto, dict[str, float]]:
        if self.reward_pool is None:
            scores, extra = self._score(batch, timings, metrics)
            if self.filter_groups.enable:
                batch = self._fill_with_varied_groups(batch, scores, extra, more_prompts, step, timings, metrics)
            else:
                _set_scores(batch, scores, extra)
        if self.balance_batch:
            self._balance(batch)
        if self.reward_pool is not None:
            self._pending = self.reward_pool.submit(
                self._rule_scores, batch.select(["responses", "response_mask", "prompts", "attention_mask"]))
        return batch, metrics

    def finish(self, batch: DataProto, timings: dict[str, float]) -> dict[str, float]:
        """Sets the scores computed in the background (phase ``reward_wait``); the step's reward
        metrics: scoring calls cut by reward.timeout, and the mean of each numeric reward extra over the rows
        that have it (megarl.reward.extra_metrics)."""
        if self._pending is not None:
            with self.phase("reward_wait", timings):
                _set_scores(batch, *self._pending.result())
            self._pending = None
        metrics = {"reward/timeouts": float(self._timeouts)}  # scored 0.0
        metrics.update(extra_metrics({k[len(_EXTRA):]: v for k, v in batch.non_tensor_batch.items() if k.startswith(_EXTRA)},
                                     self._named_extras))
        return metrics

    def _sync_weights(self, version: int, timings: dict[str, float] | None, metrics: dict[str, float]) -> None:
        """The actor's weights (``version``) into the engines when they lack them: the colocated sync, or
        the push to the standalone engines (separate_async)."""
        with self.phase("weight_sync", timings):
            if self.engines is not None:
                metrics.update(self.engines.push_weights(version))
            else:
                metrics.update(mean_metrics(self.actor.call_all("sync_weights")))

    def _generate(self, prompts: DataProto, step: int, timings: dict[str, float], metrics: dict[str, float]) -> DataProto:
        _tag(prompts, step)
        self._sync_weights(step - 1, timings, metrics)
        with self.phase("gen", timings):
            batch = self.actor.call_rollout("generate_sequences", prompts, validate=False, do_sample=True)
        metrics.update(_gen_metrics(batch))
        if needs_greedy_baselines(self.algorithm):
            with self.phase("gen_max", timings):
                batch.batch["reward_baselines"] = self._greedy_baselines(prompts, batch)
        return batch

    def _greedy_baselines(self, prompts: DataProto, batch: DataProto) -> torch.Tensor:
        """ReMax: one greedy response per prompt (do_sample=False -> temperature 0, n=1, same
        rollout group), scored by the same reward; its sequence reward for every row of ``batch``
        whose ``uid`` is that prompt's. The greedy batch is discarded.

        Returns: ``reward_baselines`` ``[len(batch)]`` float32.
        """
        greedy = DataProto(batch=prompts.batch, non_tensor_batch=dict(prompts.non_tensor_batch),
                           meta_info=dict(prompts.meta_info))
        out = self.actor.call_rollout("generate_sequences", greedy, validate=False, do_sample=False)
        out.meta_info.pop("metrics", None)
        scores, _ = self._score(out)
        by_uid = dict(zip(out.non_tensor_batch["uid"].tolist(), scores.sum(-1).tolist()))
        return torch.tensor([by_uid[u] for u in batch.non_tensor_batch["uid"].tolist()], dtype=torch.float32)

    def _fill_with_varied_groups(self, batch: DataProto, scores: torch.Tensor, extra: dict[str, list[Any]],
                                 more_prompts: Iterator[DataProto], step: int, timings: dict[str, float],
                                 metrics: dict[str, float]) -> DataProto:
        """algorithm.filter_groups: keep the groups whose metric varies; generate from further prompts
        until as many responses as the first generation made are kept (or the data ends)."""
        want = len(batch)  # data.train_batch_size prompts x rollout.n responses
        max_rounds = int(self.filter_groups.max_num_gen_batches)
        kept = [self._varied_groups(batch, scores, extra, metrics)]
        rounds = 1
        while sum(len(k) for k in kept) < want:
            if max_rounds and rounds >= max_rounds:
                raise RuntimeError(
                    f"algorithm.filter_groups: only {sum(len(k) for k in kept)} of {want} responses kept after "
                    f"{rounds} generation rounds (algorithm.filter_groups.max_num_gen_batches={max_rounds}); "
                    "the data is too easy or too hard for this policy"
                )
            prompts = next(more_prompts, None)
            if prompts is None:
                break
            batch = self._generate(prompts, step, timings, metrics)
            scores, extra = self._score(batch, timings, metrics)
            kept.append(self._varied_groups(batch, scores, extra, metrics))
            rounds += 1
        merged = DataProto.concat(kept)
        metrics["filter_groups/gen_rounds"] = float(rounds)
        return merged[: min(len(merged), want)]

    def _varied_groups(self, batch: DataProto, scores: torch.Tensor, extra: dict[str, list[Any]],
                       metrics: dict[str, float]) -> DataProto:
        values = filter_metric_values(self.filter_groups.metric, token_level_scores=scores, reward_extra_info=extra)
        kept, counts = filter_groups(batch.non_tensor_batch["uid"], values)
        metrics.update({f"filter_groups/{k}": float(v) for k, v in counts.items()})
        rows = torch.as_tensor(kept, dtype=torch.long)
        out = batch[rows]
        out.batch["token_level_scores"] = scores[rows]
        return out

    def _balance(self, batch: DataProto) -> None:
        dp_size = self.actor.layout.dp
        if len(batch) % dp_size:
            return
        lengths = batch.batch["attention_mask"].sum(-1).tolist()
        batch.reorder(torch.as_tensor(balance_order(lengths, dp_size)))

    # ------------------------------------------------------------------ scoring
    def _score(self, batch: DataProto, timings: dict[str, float] | None = None,
               metrics: dict[str, float] | None = None) -> Scores:
        """``token_level_scores`` ``[B, R]`` and reward extras of ``batch``: the rule / custom reward
        (phase ``reward``) or, with reward.reward_model.enable, the reward model's score on each
        response's last token (phase ``reward_model``)."""
        if self.reward_model is None:
            with self.phase("reward", timings):
                return self._rule_scores(batch)
        with self.phase("reward_model", timings):
            inputs, truncated = rm_inputs(batch, self.tokenizer, self.rm_tokenizer, self.rm_max_length)
            scores = self.reward_model.call_dp("compute_rm_score", inputs).batch["rm_scores"]
        if metrics is not None:
            metrics["reward_model/truncated_ratio"] = truncated
        return place_scores(scores, batch.batch["response_mask"]), {"score": scores.tolist(), "timeout": [0.0] * len(batch)}

    def _rule_scores(self, batch: DataProto) -> Scores:
        if "token_level_scores" in batch.batch.keys():  # streamed: scored in the rollout as each sample finished
            scores = batch.batch.pop("token_level_scores")
            extra = {k[len(_EXTRA):]: list(v) for k, v in batch.non_tensor_batch.items() if k.startswith(_EXTRA)}
        else:
            scores, extra = self.reward_fn(batch)
        self._timeouts += int(sum(extra["timeout"]))
        return scores, extra

    # ------------------------------------------------------------------ validation
    def validation_batch(self, prompts: DataProto, step: int) -> tuple[DataProto, list[float], int]:
        """One validation batch generated with rollout.val_kwargs and scored: the batch, each row's
        sequence score, and how many scoring calls reward.timeout cut."""
        _tag(prompts, step)
        prompts.meta_info["policy_version"] = step  # validated after this step's update
        self._sync_weights(step, None, {})
        if self.engines is not None:
            out = self.engines.validate(prompts, do_sample=self.val_do_sample)
        else:
            out = self.actor.call_rollout("generate_sequences", prompts, validate=True, do_sample=self.val_do_sample)
        out.meta_info.pop("metrics", None)
        before = self._timeouts
        token_scores, _ = self._score(out)
        return out, token_scores.sum(-1).tolist(), self._timeouts - before


def _gen_metrics(batch: DataProto) -> dict[str, float]:
    """The generation's metrics, popped from the batch (megarl.trainer.metrics.generation_metrics)."""
    metrics = batch.meta_info.pop("metrics", [])
    return generation_metrics(metrics if isinstance(metrics, list) else [metrics])


def _tag(prompts: DataProto, step: int) -> None:
    """A ``uid`` per prompt (its n responses share it), the step and the policy version the engines hold
    (``step - 1``: the weights after the previous step's update), on the batch sent to the rollout."""
    prompts.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(prompts))], dtype=object)
    prompts.meta_info.update(global_step=step, policy_version=step - 1)


def _set_scores(batch: DataProto, scores: torch.Tensor, extra: dict[str, list[Any]]) -> None:
    batch.batch["token_level_scores"] = scores
    batch.non_tensor_batch.update({f"{_EXTRA}{k}": np.array(v, dtype=object) for k, v in extra.items()})
