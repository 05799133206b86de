"""The single controller: the PPO/GRPO loop over Ray worker groups.

One step (``train_step``), phase by phase:

    rollout (megarl.trainer.rollout_stage): weight sync (when the actor changed) -> n responses per
      prompt (vLLM) [+ one greedy per prompt: remax] -> rewards (rule / custom scorers, or a learned
      reward model); with trainer.v1's async modes (``train_step_async``) the batch is the one the
      sampler forms from the groups the engines finished (megarl.trainer.v1: admission control,
      partial rollout, standalone engines for separate_async)
    -> old log-prob (actor) -> ref log-prob -> teacher log-probs (distillation) -> values (critic)
      [-> rewards scored in the background]
    -> advantages on the controller (+ in-reward KL)
    -> critic update -> actor update (after trainer.critic_warmup steps)
    -> metrics; then validation / checkpoint (``fit``)

The controller holds DataProto batches and never model weights; the worker groups
dispatch by data-parallel rank (training) or rollout replica (generation). ``self.phase``
names the phase running now (the timing names, plus init_workers, load_checkpoint,
validate, log_metrics) so a failure can say where it happened (megarl.trainer.failures).
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from megarl.algorithms import apply_kl_penalty, compute_advantage, compute_rollout_correction, get_kl_controller
from megarl.config.read import replaced, to_dict
from megarl.config.schema.root import MegaRLConfig
from megarl.parallel.layout import ParallelLayout
from megarl.protocol import DataProto
from megarl.trainer import checkpointing as ckpt
from megarl.trainer.failures import FailureContext
from megarl.utils.fault_points import pause_point
from megarl.trainer.metrics import compute_data_metrics, mean_metrics, num_tokens
from megarl.trainer.resources import ResourcePool, create_resource_pool
from megarl.trainer.resume_config import check_resume_config, refuse_fsdp_resume, run_record
from megarl.trainer.resume_fallback import load_with_fallback
from megarl.trainer.rollout_stage import RolloutStage
from megarl.trainer.v1.colocated_engines import ColocatedEngines
from megarl.trainer.v1.sampler import AsyncSampler
from megarl.trainer.v1.staleness import staleness_metrics
from megarl.trainer.v1.standalone_engines import StandaloneEngines
from megarl.trainer.worker_group import WorkerGroup
from megarl.utils.bounded import CLEANUP_TIMEOUT_S, within
from megarl.utils.timer import timed
from megarl.utils.tracking import Tracking, dump_generations

SHUTDOWN_TIMEOUT_S = 120.0
ACTOR_CLS = "megarl.workers.hybrid:ActorRolloutRefWorker"
SPLIT_ACTOR_CLS = "megarl.workers.split_actor:SplitActorWorker"  # separate_async: no engine beside the actor
CRITIC_CLS = "megarl.workers.critic:CriticWorker"
REWARD_MODEL_CLS = "megarl.workers.reward_model:RewardModelWorker"
TEACHER_CLS = "megarl.workers.teacher:TeacherWorker"
_ENV_PREFIXES = ("VLLM_", "NCCL_", "MEGARL_", "HF_", "TORCH_", "GLOO_", "CUDA_DEVICE_MAX_CONNECTIONS", "OMP_NUM_THREADS",
                 "TOKENIZERS_PARALLELISM", "PYTHONPATH")


def resolve_device(cfg: MegaRLConfig) -> str:
    """trainer.device; auto = cuda when the Ray cluster has GPUs."""
    import ray

    device = cfg.trainer.device
    if device == "auto":
        return "cuda" if ray.cluster_resources().get("GPU", 0) > 0 else "cpu"
    return device


def _worker_env(device: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)}
    if device == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def _merge(batch: DataProto, out: DataProto) -> dict[str, float]:
    """Copy ``out``'s tensors into ``batch``; return the metrics the workers attached."""
    for key in out.batch.keys():
        batch.batch[key] = out.batch[key]
    metrics = out.meta_info.get("metrics", [])
    return mean_metrics(metrics if isinstance(metrics, list) else [metrics])


def _verify_initial_dist_checkpoints(cfg: MegaRLConfig, use_critic: bool) -> None:
    """``megatron.use_dist_checkpointing`` initial weights (actor, ref, critic): refuse, before any
    worker loads them, a checkpoint that would run code when unpickled (megarl.utils.safe_checkpoint)."""
    from megarl.utils.safe_checkpoint import verify_dist_checkpoint

    nodes = [cfg.actor_rollout_ref.actor.megatron, cfg.actor_rollout_ref.ref.megatron]
    if use_critic:
        nodes.append(cfg.critic.megatron)
    for node in nodes:
        path = node.dist_checkpointing_path if node.use_dist_checkpointing else None
        if path:
            path = os.path.expanduser(str(path))
            inner = os.path.join(path, "dist_ckpt")
            verify_dist_checkpoint(inner if os.path.isdir(inner) else path)


class RayPPOTrainer:
    """Builds the data, reward, worker groups and loggers of the run's typed config and chooses the
    checkpoint to resume (verified, its config compared with ``cfg``), all before Ray starts;
    ``init_workers()`` starts the workers, ``fit()`` trains. ``close()`` releases the workers (and
    removes a checkpoint left half-written by a failure).
    """

    def __init__(self, cfg: MegaRLConfig) -> None:
        from megarl.data import create_dataloader
        from megarl.data.tokenizer import load_data_tokenizer

        self.cfg = cfg
        self.tokenizer = load_data_tokenizer(cfg)  # the preflight loaded the same one (custom chat template included)
        self.train_loader = create_dataloader(cfg.data, self.tokenizer, "train")
        self.val_loader = create_dataloader(cfg.data, self.tokenizer, "val") if cfg.data.val_files else None
        steps_per_epoch = len(self.train_loader)
        self.total_steps = int(cfg.trainer.total_epochs) * steps_per_epoch
        if cfg.trainer.total_training_steps:
            self.total_steps = min(self.total_steps, int(cfg.trainer.total_training_steps))
        self.use_critic = cfg.trains_critic()
        self.use_reference = cfg.runs_reference()
        self.use_kl_in_reward = bool(cfg.algorithm.use_kl_in_reward)
        self.kl_ctrl = get_kl_controller(cfg.algorithm.kl_ctrl) if self.use_kl_in_reward else None
        self.rollout = RolloutStage(cfg, self.tokenizer, self._phase)
        self.mode = cfg.trainer.trainer_mode()  # trainer.v1.trainer_mode (sync with use_v1=false)
        self.sampler: AsyncSampler | None = None  # the async modes' admission and batches
        self.engines: StandaloneEngines | None = None  # separate_async's engines
        self.reward_model: WorkerGroup | None = None
        self.global_step = 0
        self.phase = "start"
        self.saving_step: int | None = None  # set while a checkpoint is being written
        self.pool: ResourcePool | None = None
        self.actor: WorkerGroup | None = None
        self.critic: WorkerGroup | None = None
        self.teacher: WorkerGroup | None = None
        self.teacher_pool: ResourcePool | None = None
        root = os.path.expanduser(cfg.trainer.default_local_dir)
        self.ckpt_root = root
        self.resume_path, self.resume_state = self._plan_resume()
        self.tracking = Tracking(
            list(cfg.trainer.logger), project=cfg.trainer.project_name, experiment=cfg.trainer.experiment_name,
            log_dir=root, total_steps=self.total_steps,
            config=to_dict(cfg),
        )
        self.rollout.start()  # its scorers fork now: run_ppo builds the trainer before Ray starts threads here

    @contextmanager
    def _phase(self, name: str, timings: dict[str, float] | None = None) -> Iterator[None]:
        """Run a phase: ``self.phase`` names it (and stays so when it raises), timed into ``timings``."""
        previous, self.phase = self.phase, name
        with timed(name, timings) if timings is not None else nullcontext():
            yield
        self.phase = previous

    def failure_context(self) -> FailureContext:
        """Where the run is now, for megarl.trainer.failures."""
        try:
            step = ckpt.read_tracker(self.ckpt_root)
        except ValueError:
            step = None
        latest = None if step is None else str(ckpt.step_dir(self.ckpt_root, step))
        return FailureContext(phase=self.phase, step=self.global_step, run_dir=self.ckpt_root, latest=latest)

    # ------------------------------------------------------------------ workers
    def init_workers(self) -> None:
        """Placement groups, then the colocated actor/rollout/ref group and the critic group (with
        separate_async: the actor/ref group without engines, then the standalone engines' pool)."""
        self.phase = "init_workers"
        cfg = self.cfg
        _verify_initial_dist_checkpoints(cfg, self.use_critic)
        self.device = resolve_device(cfg)
        use_gpu = self.device == "cuda"
        nnodes, per_node = int(cfg.trainer.nnodes), int(cfg.trainer.n_gpus_per_node)
        distillation = cfg.distillation if cfg.distillation.enabled else None
        teacher_colocated = distillation is not None and distillation.nnodes == 0
        groups = 1 + int(self.use_critic) + int(self.rollout.uses_reward_model) + int(teacher_colocated)
        # CPU runs share this machine's cores: small fractional reservations per rank.
        cpus_per_slot = 1.0 if use_gpu else 0.5
        self.pool = create_resource_pool(nnodes, per_node, use_gpu, cpus_per_slot)
        share_cpu, share_gpu = cpus_per_slot / groups, (1.0 / groups if use_gpu else 0.0)
        env = _worker_env(self.device)
        role = "actor_rollout_ref" if self.use_reference else "actor_rollout"
        world = self.pool.world_size
        # Workers get typed sections; verl's optim.total_training_steps, the lr schedule's length, is
        # the run's step count, known only now (verl's trainer sets it too).
        steps = self.total_steps
        arr = cfg.actor_rollout_ref
        arr = replaced(arr, actor=replaced(arr.actor, optim=replaced(arr.actor.optim, total_training_steps=steps)))
        critic = replaced(cfg.critic, optim=replaced(cfg.critic.optim, total_training_steps=steps))
        # algorithm.rollout_correction: read by the actor's bypass_mode policy loss
        separate = self.mode == "separate_async"
        self.actor = WorkerGroup("actor_rollout_ref", SPLIT_ACTOR_CLS if separate else ACTOR_CLS, (arr,),
                                 {"role": role, "device": self.device,
                                  "rollout_correction": cfg.algorithm.rollout_correction,
                                  "reward": self.rollout.stream_spec, "distillation": distillation},
                                 self.pool.placements,
                                 share_cpu, share_gpu, env,
                                 layout=ParallelLayout.from_megatron_config(arr.actor.megatron, world),
                                 rollout_layout=None if separate else ParallelLayout(
                                     world_size=world, tp=arr.rollout.tensor_model_parallel_size))
        if self.use_critic:
            self.critic = WorkerGroup("critic", CRITIC_CLS, (critic,), {"device": self.device},
                                      self.pool.placements, share_cpu, share_gpu, env,
                                      layout=ParallelLayout.from_megatron_config(cfg.critic.megatron, world))
        if self.rollout.uses_reward_model:
            rm = cfg.reward.reward_model
            self.reward_model = WorkerGroup(
                "reward_model", REWARD_MODEL_CLS, (rm,), {"device": self.device}, self.pool.placements,
                share_cpu, share_gpu, env,
                layout=ParallelLayout(world_size=world, tp=rm.rollout.tensor_model_parallel_size,
                                      pp=rm.rollout.pipeline_model_parallel_size))
        if distillation is not None:
            self.teacher = self._teacher_group(distillation, share_cpu, share_gpu, env, cpus_per_slot)
        # Critic, reward model and teacher first: their worlds must exist before vLLM grabs memory on GPUs.
        for group in (self.critic, self.reward_model, self.teacher):
            if group is not None:
                group.call_all("init_model")
        self.actor.call_all("init_model")
        if separate:
            self.engines = StandaloneEngines(cfg, self.actor, self.device, env)
            self.engines.init()
        self.rollout.attach(self.actor, self.reward_model, self.engines)
        if self.mode != "sync":
            self.sampler = AsyncSampler(cfg, self.train_loader, self.engines or ColocatedEngines(self.actor))
        self.phase = "start"

    def _teacher_group(self, distillation, share_cpu: float, share_gpu: float, env: dict[str, str],
                       cpus_per_slot: float) -> WorkerGroup:
        """The distillation teacher: on the trainer's slots (distillation.nnodes=0, verl's default), or
        on its own pool of distillation.nnodes x n_gpus_per_node slots (whole slots then)."""
        placements = self.pool.placements
        if distillation.nnodes > 0:
            self.teacher_pool = create_resource_pool(distillation.nnodes, distillation.n_gpus_per_node,
                                                     self.pool.use_gpu, cpus_per_slot, prefix="distillation")
            placements = self.teacher_pool.placements
            share_cpu, share_gpu = cpus_per_slot, (1.0 if self.pool.use_gpu else 0.0)
        tp = distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size
        return WorkerGroup("teacher", TEACHER_CLS, (distillation,), {"device": self.device}, placements,
                           share_cpu, share_gpu, env, layout=ParallelLayout(world_size=len(placements), tp=tp))

    def close(self, graceful: bool = True) -> None:
        """Release workers, placement groups, loggers. ``graceful``: ask the actor group to shut
        its engines down first (bounded by SHUTDOWN_TIMEOUT_S); after a failure the worker
        processes are killed at once (ranks may be stuck in a collective with a dead peer). The
        calls to the cluster are bounded (megarl.utils.bounded: it may be going down too)."""
        graceful_groups = 1 + (self.engines is not None)  # the actor's engines, separate_async's engines
        within(CLEANUP_TIMEOUT_S + (graceful_groups * SHUTDOWN_TIMEOUT_S if graceful else 0), "stopping the workers",
               self._release_workers, graceful)
        if self.saving_step is not None:  # a failed save: its workers are gone now, remove what they wrote
            ckpt.abort_save(self.ckpt_root, self.saving_step)
        self.rollout.close()
        self.tracking.close()

    def _release_workers(self, graceful: bool) -> None:
        for group in (self.actor, self.critic, self.reward_model, self.teacher):
            if group is not None:
                if graceful and group is self.actor:
                    try:
                        group.call_all_within(SHUTDOWN_TIMEOUT_S, "shutdown")
                    except Exception as error:
                        print(f"[megarl] {group.name}.shutdown: {error}", flush=True)
                group.shutdown()
        if self.engines is not None:
            self.engines.close(graceful, SHUTDOWN_TIMEOUT_S)
        for pool in (self.pool, self.teacher_pool):
            if pool is not None:
                pool.release()

    # ------------------------------------------------------------------ one step
    def train_step(self, prompts: DataProto, prompts_iter: Iterator[DataProto]) -> dict[str, float]:
        """One PPO step on ``prompts`` (``prompts_iter``: the epoch's next batches, which
        algorithm.filter_groups may draw on); returns the step's metrics."""
        timings: dict[str, float] = {}
        start = time.perf_counter()
        batch, metrics = self.rollout.run(prompts, prompts_iter, self.global_step, timings)
        return self._train(batch, metrics, timings, start)

    def train_step_async(self) -> dict[str, float]:
        """One step of trainer.v1's colocate_async / separate_async: the sampler's batch (the weight
        sync or push, admission, generation: megarl.trainer.v1.sampler), then the same PPO step."""
        timings: dict[str, float] = {}
        start = time.perf_counter()
        batch, metrics = self.rollout.run_async(self.sampler, self.global_step, timings)
        return self._train(batch, metrics, timings, start)

    def _train(self, batch: DataProto, metrics: dict[str, float], timings: dict[str, float],
               start: float) -> dict[str, float]:
        """The PPO step on a generated, scored batch; ``start``: the step's start (perf_counter)."""
        metrics.update(self._log_probs_and_values(batch, timings))
        metrics.update(self.rollout.finish(batch, timings))
        metrics.update(self._advantages(batch, timings))
        metrics.update(self._update(batch, timings))
        metrics.update(self._step_metrics(batch, timings, time.perf_counter() - start))
        if self.cfg.trainer.rollout_data_dir:
            self._dump(batch, self.cfg.trainer.rollout_data_dir)
        return metrics

    def _log_probs_and_values(self, batch: DataProto, timings: dict[str, float]) -> dict[str, float]:
        """Old log-probs (actor; the rollout's own in bypass mode), reference log-probs, the teacher's
        log-probs (distillation), values."""
        metrics: dict[str, float] = {}
        with self._phase("old_log_prob", timings):
            if self.cfg.algorithm.rollout_correction.bypass_mode:
                batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]
            else:
                metrics.update(_merge(batch, self.actor.call_dp("compute_log_prob", batch)))
        if self.use_reference:
            with self._phase("ref", timings):
                metrics.update(_merge(batch, self.actor.call_dp("compute_ref_log_prob", batch)))
        if self.teacher is not None:
            with self._phase("teacher", timings):
                _merge(batch, self.teacher.call_dp("compute_teacher_log_prob", batch))
        if self.use_critic:
            with self._phase("values", timings):
                _merge(batch, self.critic.call_dp("compute_values", batch))
        return metrics

    def _advantages(self, batch: DataProto, timings: dict[str, float]) -> dict[str, float]:
        """Rewards (scores, minus the in-reward KL penalty), rollout correction, advantages and returns."""
        rc = self.cfg.algorithm.rollout_correction
        metrics: dict[str, float] = {}
        with self._phase("adv", timings):
            mask = batch.batch["response_mask"]
            if self.use_kl_in_reward:
                rewards, kl_metrics = apply_kl_penalty(
                    batch.batch["token_level_scores"], batch.batch["old_log_probs"], batch.batch["ref_log_prob"],
                    mask, self.kl_ctrl, self.cfg.algorithm.kl_penalty,
                )
                metrics.update(kl_metrics)
            else:
                rewards = batch.batch["token_level_scores"]
            batch.batch["token_level_rewards"] = rewards
            if not rc.bypass_mode and "rollout_log_probs" in batch.batch.keys() and (
                    rc.rollout_is or rc.rollout_rs or rc.rollout_token_veto_threshold):
                weights, new_mask, corr = compute_rollout_correction(
                    batch.batch["old_log_probs"], batch.batch["rollout_log_probs"], mask, rc)
                if weights is not None:
                    batch.batch["rollout_is_weights"] = weights
                batch.batch["response_mask"] = new_mask.to(mask.dtype)
                metrics.update(corr)
            advantages, returns = compute_advantage(batch, self.cfg.algorithm)
            batch.batch["advantages"], batch.batch["returns"] = advantages, returns
        if self.kl_ctrl is not None:
            metrics["actor/reward_kl_coef"] = float(self.kl_ctrl.value)
        return metrics

    def _update(self, batch: DataProto, timings: dict[str, float]) -> dict[str, float]:
        """Critic update, then (after trainer.critic_warmup steps) actor update."""
        t = self.cfg.trainer
        # trainer.nan_policy: a NaN/Inf loss or grad norm stops the run naming this step and
        # the phase, or (skip) drops that optimizer step (megarl.utils.nonfinite).
        batch.meta_info.update(global_step=self.global_step, nan_policy=t.nan_policy)
        metrics: dict[str, float] = {}
        if self.use_critic:
            with self._phase("update_critic", timings):
                metrics.update(mean_metrics(self.critic.call_dp("update_critic", batch, pad=False)))
        if self.global_step > int(t.critic_warmup):
            with self._phase("update_actor", timings):
                pause_point("update_actor", self.global_step)
                metrics.update(mean_metrics(self.actor.call_dp("update_actor", batch, pad=False)))
        return metrics

    def _step_metrics(self, batch: DataProto, timings: dict[str, float], step_s: float) -> dict[str, float]:
        """Data metrics of the batch, its staleness (the policy versions of its tokens), the phases'
        times and the step's throughput."""
        timings["step"] = step_s
        tokens = num_tokens(batch)
        staleness = (staleness_metrics(batch.batch["rollout_versions"], self.global_step - 1)
                     if "rollout_versions" in batch.batch.keys() else {})
        return {**compute_data_metrics(batch, self.use_critic), **staleness,
                **{f"timing_s/{k}": v for k, v in timings.items()},
                "perf/total_num_tokens": float(tokens), "perf/tokens_per_s": tokens / step_s,
                "perf/tokens_per_s_per_rank": tokens / step_s / self.actor.world_size}

    def _texts(self, batch: DataProto) -> tuple[list[str], list[str]]:
        from megarl.reward import decode_responses

        prompts = [self.tokenizer.decode(ids[m.bool()].tolist(), skip_special_tokens=True)
                   for ids, m in zip(batch.batch["prompts"], batch.batch["attention_mask"][:, : batch.batch["prompts"].shape[1]])]
        return prompts, decode_responses(batch, self.tokenizer)

    def _dump(self, batch: DataProto, directory: str, scores: list[float] | None = None) -> None:
        prompts, outputs = self._texts(batch)
        if scores is None:
            scores = batch.batch["token_level_scores"].sum(-1).tolist()
        truths = [r.get("ground_truth") if isinstance(r, dict) else r
                  for r in batch.non_tensor_batch.get("reward_model", [None] * len(batch))]
        rows = {"input": prompts, "output": outputs, "score": scores, "ground_truth": truths,
                "step": [self.global_step] * len(batch)}
        if "reward_baselines" in batch.batch.keys():  # remax: the greedy response's score
            rows["reward_baseline"] = batch.batch["reward_baselines"].tolist()
        if "rollout_versions" in batch.batch.keys():  # the policy versions of each row's oldest and newest tokens
            versions = batch.batch["rollout_versions"]
            rows["oldest_version"] = versions.masked_fill(versions < 0, 2**62).min(-1).values.tolist()
            rows["newest_version"] = versions.max(-1).values.tolist()
        dump_generations(os.path.expanduser(directory), self.global_step, rows)

    # ------------------------------------------------------------------ validation
    def validate(self) -> dict[str, float]:
        """Generate with rollout.val_kwargs on the whole validation set; reward by data_source."""
        if self.val_loader is None:
            return {}
        scores_by_source: dict[str, list[float]] = defaultdict(list)
        lengths: list[float] = []
        batches = []
        timeouts = 0
        for prompts in self.val_loader:
            out, scores, cut = self.rollout.validation_batch(prompts, self.global_step)
            timeouts += cut
            for src, s in zip(out.non_tensor_batch[self.rollout.reward_fn_key], scores):
                scores_by_source[str(src)].append(s)
            lengths += out.batch["response_mask"].sum(-1).float().tolist()
            batches.append((out, scores))
        every = [s for v in scores_by_source.values() for s in v]
        metrics = {"val/reward/mean": float(np.mean(every)), "val/response_length/mean": float(np.mean(lengths)),
                   "val/reward/timeouts": float(timeouts)}
        for src, values in scores_by_source.items():
            metrics[f"val/{src}/reward/mean"] = float(np.mean(values))
        if self.cfg.trainer.validation_data_dir:
            merged = DataProto.concat([b for b, _ in batches])
            self._dump(merged, self.cfg.trainer.validation_data_dir, [s for _, ss in batches for s in ss])
        n_show = int(self.cfg.trainer.log_val_generations)
        if n_show:
            prompts, outputs = self._texts(batches[0][0])
            for p, o, s in list(zip(prompts, outputs, batches[0][1]))[:n_show]:
                print(f"[megarl val] step {self.global_step} score {s:.3g}\n  prompt: {p!r}\n  output: {o!r}", flush=True)
        return metrics

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> None:
        """Write step ``global_step`` aside, then publish it (megarl.trainer.checkpointing)."""
        step, root = self.global_step, self.ckpt_root
        path = ckpt.begin_save(root, step)
        self.saving_step = step
        self.actor.call_all("save_checkpoint", str(path / "actor"), step)
        if self.critic is not None:
            self.critic.call_all("save_checkpoint", str(path / "critic"), step)
        pause_point("save_checkpoint", step)
        feed = self.sampler.state() if self.sampler is not None else None  # async: the oldest untrained prompt
        ckpt.write_trainer_state(path, {
            "global_step": step,
            "dataloader": self.train_loader.state_dict() if feed is None else feed["loader"],
            "dataloader_skip": 0 if feed is None else feed["skip"],
            "kl_coef": None if self.kl_ctrl is None else self.kl_ctrl.value,
            "rng": ckpt.rng_state(),
        })
        ckpt.write_run_config(path, run_record(self.cfg, self.use_critic))
        t = self.cfg.trainer
        ckpt.finish_save(root, step, {"actor": t.max_actor_ckpt_to_keep, "critic": t.max_critic_ckpt_to_keep})
        self.saving_step = None

    def _plan_resume(self, below: int | None = None) -> tuple[Path | None, dict[str, Any] | None]:
        """The checkpoint to resume and its trainer state, checked before any worker starts: files
        against their checksums (auto falls back past a damaged one), nothing that could run code
        when unpickled, and the stored config against this run's (changes that cannot apply are
        refused, the others listed), one of the other data-parallel wrapper (Megatron-FSDP / DDP), or FSDP's at another layout, too. ``below``: a step before this one
        (the one that failed to load)."""
        t = self.cfg.trainer
        components = ("actor", "critic") if self.use_critic else ("actor",)
        path = ckpt.resume_dir(t.resume_mode, self.ckpt_root, t.resume_from_path, components, below=below)
        if path is None:
            return None, None
        ckpt.verify_components(path, components)  # nothing a worker loads may run code when unpickled
        state = ckpt.read_trainer_state(path)
        record = ckpt.read_run_config(path)
        refuse_fsdp_resume(record, self.cfg, self.use_critic, str(path))
        if record is None:
            print(f"[megarl] WARNING: {path} stores no run config (written by an older megarl): changes since it are "
                  "not checked", flush=True)
        else:
            changes = check_resume_config(record, self.cfg, self.use_critic, str(path))
            if changes:
                print(f"[megarl] resuming {path}: config changes since that checkpoint:\n  " + "\n  ".join(changes),
                      flush=True)
        return path, state

    def load_checkpoint(self) -> None:
        path, state = self.resume_path, self.resume_state
        if path is None:
            return
        with self._phase("load_checkpoint"):  # a step the workers fail to load falls back to an older one (auto)
            groups = {"actor": self.actor, **({"critic": self.critic} if self.critic is not None else {})}
            path, older_state = load_with_fallback(path, self.cfg.trainer.resume_mode == "auto", groups, self._plan_resume)
            state = older_state or state
            self.resume_path = path
        self.global_step = int(state["global_step"])
        if self.sampler is not None:
            self.sampler.load_state({"loader": state["dataloader"], "skip": int(state.get("dataloader_skip", 0))},
                                    self.global_step)
        else:
            self.train_loader.load_state_dict(state["dataloader"])
        # The adaptive controller continues from its stored value; a fixed one takes the config's
        # kl_coef (a change is listed by check_resume_config).
        if self.kl_ctrl is not None and state.get("kl_coef") is not None and self.cfg.algorithm.kl_ctrl.type == "adaptive":
            self.kl_ctrl.value = float(state["kl_coef"])
        ckpt.set_rng_state(state["rng"])
        print(f"[megarl] resumed from {path} (step {self.global_step})", flush=True)

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict[str, float]:
        """Train to trainer.total_training_steps (or total_epochs); returns the last step's metrics."""
        t = self.cfg.trainer
        self.load_checkpoint()
        last: dict[str, float] = {}
        if self.val_loader is not None and t.val_before_train:  # verl: a resumed run validates too, at its step
            with self._phase("validate"):
                val = self.validate()
            with self._phase("log_metrics"):
                self.tracking.log(val, step=self.global_step)
            last.update(val)
        if t.val_only:  # verl: the validation before training (val_before_train) is the whole run
            return last
        if self.sampler is not None:  # async modes: the sampler takes the prompts, epoch after epoch
            while self.global_step < self.total_steps:
                self.global_step += 1
                step_start = time.perf_counter()
                last = self._end_step(self.train_step_async(), step_start)
            return last
        while self.global_step < self.total_steps and self.train_loader.sampler.epoch < int(t.total_epochs):
            prompts_iter = iter(self.train_loader)
            for prompts in prompts_iter:
                self.global_step += 1
                step_start = time.perf_counter()
                last = self._end_step(self.train_step(prompts, prompts_iter), step_start)
                if self.global_step >= self.total_steps:
                    return last
        return last

    def _end_step(self, metrics: dict[str, float], step_start: float) -> dict[str, float]:
        """Validation and checkpoint when due (trainer.test_freq / save_freq, and after the last step),
        then the step's metrics logged; returns them. ``step_start``: perf_counter() at the step's start."""
        t = self.cfg.trainer
        test_freq, save_freq = int(t.test_freq), int(t.save_freq)
        is_last = self.global_step >= self.total_steps
        if self.val_loader is not None and test_freq > 0 and (is_last or self.global_step % test_freq == 0):
            with self._phase("validate"), timed("testing", metrics_t := {}):
                metrics.update(self.validate())
            metrics["timing_s/testing"] = metrics_t["testing"]
        if save_freq > 0 and (is_last or self.global_step % save_freq == 0):
            with self._phase("save_checkpoint", metrics_t := {}):
                self.save_checkpoint()
            metrics["timing_s/save_checkpoint"] = metrics_t["save_checkpoint"]
        metrics["timing_s/step"] = time.perf_counter() - step_start  # verl's: validation and checkpoint included
        metrics["training/global_step"] = float(self.global_step)
        metrics["training/epoch"] = float(self.train_loader.sampler.epoch)
        with self._phase("log_metrics"):
            self.tracking.log(metrics, step=self.global_step)
        return metrics
