"""The launch plan of a resolved config: placement, memory per role and phase, and its verdict.

Every role is colocated on every GPU of the trainer (see :mod:`megarl.plan.placement`) but the
distillation teacher with ``distillation.nnodes > 0``, which has its own pool of
``distillation.nnodes x distillation.n_gpus_per_node`` GPUs and one phase there, and the vLLM engines
of ``trainer.v1.trainer_mode=separate_async``, one per GPU of their own pool
(``actor_rollout_ref.rollout.nnodes x n_gpus_per_node``), where ``generate`` is their one phase and the
trainer's GPUs hold no vLLM memory in any phase. The phases follow
the colocated workers' memory choreography; each phase lists its terms (bytes per GPU), so a
measured peak can be set beside each one:

* ``init``: the Megatron roles are built in turn (critic, reward model, teacher, actor, reference:
  the trainer's order) before vLLM starts, each whole (parameters, gradients, optimizer state) and
  then offloaded per its ``param_offload`` (parameters and gradients) / ``grad_offload``
  (gradients) / ``optimizer_offload``; the forward-only reward model and teacher offload their
  parameters per their ``free_cache_engine`` (megarl.workers.megatron.worker_base.forward_only_megatron);
  the peak is the role being built beside what the ones built before it keep.
* ``sync`` (weights into vLLM): the actor's parameters on the device (onloaded when
  ``param_offload``; its gradients and optimizer state stay where they are between phases),
  vLLM's weights awake (weights / rollout TP), one weight-sync bucket
  (``rollout.weight_sync.bucket_size_mb``) and the other roles' between-phase state. vLLM's KV
  cache is not awake yet. An MoE actor syncs through vLLM's ``reload_weights`` (its fused expert
  parameters load through vLLM's own loaders), whose layer-wise loader keeps a bucket's tensors
  until their layer is complete, so two buckets are alive (4.29 GB with 2,048 MiB buckets measured,
  Qwen3-30B-A3B shape at EP=4, benchmarks/RESULTS.md 2026-11-27).
* ``generate``: vLLM's whole budget (``gpu_memory_utilization`` x GPU) + every role's
  between-phase state (the actor's parameters offloaded again when ``param_offload``). On
  separate_async's pool: the budget + one weight-push bucket being received, nothing else; the
  trainer's ``sync`` there is the export alone (the actor's parameters and one bucket).
* forward passes (``old_log_prob``, none with ``algorithm.rollout_correction.bypass_mode``;
  ``ref_log_prob``, ``values``, ``teacher_log_prob``, ``reward_model``): vLLM asleep at level 2
  (weights and KV cache released; awake all along when ``rollout.free_cache_engine=false``),
  the role's parameters on the device (not its gradients or optimizer state) + its forward
  activations + the others' between-phase state. The teacher on its own pool: its parameters
  + its forward activations, nothing else. The teacher's and reward model's micro-batches are
  ``max_num_seqs`` rows, at most a data-parallel rank's share of the step's
  ``data.train_batch_size x rollout.n`` rows.
* updates (``update_actor``, ``update_critic``): the trained role whole + its training
  activations + the others' between-phase state.
* Megatron-FSDP (an actor's or critic's ``megatron.use_megatron_fsdp``): its parameters and gradients
  are DP shards in every phase (:mod:`megarl.plan.memory`), plus its gathered layers in its forward
  passes, those and their unsharded gradients in its update, and its whole TP-local model in ``sync``
  (``unsharded_params``) beside the shards.

Every phase also holds an overhead (:mod:`megarl.plan.overhead`, fitted to the device memory in use
of the GPU runs): the worker process's CUDA context and communicators, more with expert parallelism,
what vLLM keeps while it sleeps (every phase after it started but generate), and a CUDA context for
each further process (critic, reward model, colocated teacher). The plan refuses when a phase exceeds the GPU
(``trainer.memory_plan.gpu_memory_gib``), or when a node's host memory
(``trainer.memory_plan.host_memory_gib``) cannot hold the page-locked copies of what every GPU of
the node offloads, the state Megatron's CPU optimizer keeps in host memory for each
(``override_optimizer_config.optimizer_cpu_offload``; its GPU part is the role's ``optimizer`` term,
which ``optimizer_offload`` moves between phases) plus :data:`HOST_OVERHEAD_PER_GPU` per worker process.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf

from megarl.config.errors import Issue
from megarl.config.read import typed_config
from megarl.config.schema import MegaRLConfig
from megarl.config.rules.roles import ACTOR, CRITIC, REF, RM_ROLE, TEACHER_ROLE, Role, need_critic, need_reference
from megarl.config.rules.view import value_at
from megarl.config.schema.megatron import cpu_offload_fraction
from megarl.config.schema.trainer import MemoryPlanConfig
from megarl.parallel.layout import ParallelLayout
from megarl.plan.memory import RankMemory, TrainSetup, VllmMemory, rank_memory, vllm_memory
from megarl.plan.model_size import ParamCount, count_params, load_shape
from megarl.plan.overhead import OWN_POOL, trainer_overhead

__all__ = ["Phase", "Plan", "RolePlan", "build_plan", "gpu_memory_gib"]

GIB = 2**30
MIB = 2**20
DEFAULT_GPU_GIB = 80.0
# Host memory of each GPU's worker process besides its offload buffers: torch, CUDA, Megatron and
# vLLM loaded, the Ray worker, the HF weights while they load. The 7B TP=2 run of 2026-11-26 used
# ~39 GB of the node's RAM beyond its pinned buffers for two such processes.
HOST_OVERHEAD_PER_GPU = 20 * GIB
FORWARD_PHASE = {"actor": "old_log_prob", "ref": "ref_log_prob", "critic": "values",
                 "teacher": "teacher_log_prob", "reward_model": "reward_model"}
# megarl.trainer.ppo_trainer.init_workers: critic, reward model and teacher first, then the actor's group
BUILD_ORDER = ("critic", "reward_model", "teacher", "actor", "ref")
SERVED = (RM_ROLE, TEACHER_ROLE)  # forward-only models verl serves with vLLM: layout and offload from its keys
TRAINER_POOL, TEACHER_POOL, ROLLOUT_POOL = "trainer", "distillation", "rollout"


@dataclass(frozen=True)
class RolePlan:
    role: Role
    layout: ParallelLayout
    params: ParamCount
    memory: RankMemory
    param_offload: bool
    grad_offload: bool  # megatron.grad_offload (verl <= 0.8): the gradients alone
    optimizer_offload: bool
    pool: str = TRAINER_POOL  # TEACHER_POOL: the teacher on its own GPUs (distillation.nnodes > 0)

    @property
    def param_offload_key(self) -> str:
        """The key that offloads its parameters between phases (a served model's free_cache_engine)."""
        return f"{self.role.megatron}.{'free_cache_engine' if self.role in SERVED else 'param_offload'}"

    @property
    def grads_offloaded(self) -> bool:
        return self.param_offload or self.grad_offload

    def kept(self, *, params_onloaded: bool = False) -> dict[str, int]:
        """Bytes this role keeps on the GPU between its phases, by part (zero parts left out);
        ``params_onloaded``: its parameters on the device whatever ``param_offload`` says."""
        m = self.memory
        parts = {"params": m.params if params_onloaded or not self.param_offload else 0,
                 "grads": 0 if self.grads_offloaded else m.grads,
                 "optimizer": 0 if self.optimizer_offload else m.optimizer}
        return {f"{self.role.name} {part}": size for part, size in parts.items() if size}

    @property
    def between_phases(self) -> int:
        """Bytes it keeps on the GPU while another phase runs."""
        return sum(self.kept().values())

    @property
    def optim_section(self) -> str:
        """Its optimizer node (`*.optim`)."""
        return f"{self.role.megatron.rsplit('.', 1)[0]}.optim"

    @property
    def offloaded(self) -> int:
        """Bytes it keeps in (page-locked) host memory between phases, per GPU."""
        m = self.memory
        return ((m.params if self.param_offload else 0) + (m.grads if self.grads_offloaded else 0)
                + (m.optimizer if self.optimizer_offload else 0))

    def fsdp_gathered(self, part: str) -> dict[str, int]:
        """Megatron-FSDP's whole-held parameters in a phase (none under DDP): ``forward`` the gathered
        layers, ``train`` those and their unsharded gradients, ``sync`` the whole TP-local stage."""
        g = self.memory.fsdp
        if g is None:
            return {}
        sizes = {"forward": {"FSDP gathered layers": g.layers},
                 "train": {"FSDP gathered layers": g.layers, "FSDP gathered layer grads": g.layer_grads},
                 "sync": {"FSDP gathered model": g.model}}[part]
        return {f"{self.role.name} {term}": size for term, size in sizes.items() if size}

    def whole(self) -> dict[str, int]:
        m = self.memory
        parts = {"params": m.params, "grads": m.grads, "optimizer": m.optimizer}
        return {f"{self.role.name} {part}": size for part, size in parts.items() if size}


@dataclass(frozen=True)
class Phase:
    """One phase's peak on one GPU: named terms in bytes; ``role``: the Megatron role whose
    state the phase loads (None for ``generate``); ``pool``: whose GPUs (TRAINER_POOL,
    TEACHER_POOL or ROLLOUT_POOL); ``overhead_parts``: its ``overhead`` term by part."""

    terms: dict[str, int]
    role: str | None
    pool: str = TRAINER_POOL
    overhead_parts: dict[str, int] = field(default_factory=dict)  # the "overhead" term by part

    @property
    def total(self) -> int:
        return sum(self.terms.values())


@dataclass
class Plan:
    nnodes: int
    per_node: int
    gpu_bytes: int
    roles: dict[str, RolePlan]
    rollout_tp: int
    vllm: VllmMemory
    vllm_awake_in_training: bool
    bucket_bytes: int
    host_bytes: int | None  # one node's RAM (None: not known, not judged)
    teacher_pool: tuple[int, int] | None = None  # the teacher's own (nodes, GPUs per node); None: colocated or none
    rollout_pool: tuple[int, int] | None = None  # separate_async's engines' (nodes, GPUs per node); None: colocated
    actor_forward: bool = True  # an old_log_prob pass; not in bypass mode (the rollout's log-probs are the old policy)
    phases: dict[str, Phase] = field(default_factory=dict)
    issues: list[Issue] = field(default_factory=list)


def gpu_memory_gib(memory_plan: MemoryPlanConfig, device: str) -> float:
    """``trainer.memory_plan.gpu_memory_gib``; null: the memory of this machine's first GPU when
    ``trainer.device`` is not cpu and torch sees one, else 80. (torch reads the size without
    creating a CUDA context.)"""
    if memory_plan.gpu_memory_gib is not None:
        return float(memory_plan.gpu_memory_gib)
    if device != "cpu":
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).total_memory / GIB
    return DEFAULT_GPU_GIB


def host_memory_gib(memory_plan: MemoryPlanConfig, device: str) -> float | None:
    """``trainer.memory_plan.host_memory_gib``; null: this machine's RAM when it is a GPU node of
    the run (``trainer.device`` not cpu and torch sees a GPU), else None: a login node's RAM says
    nothing of the cluster's, so the host memory is reported, not judged."""
    if memory_plan.host_memory_gib is not None:
        return float(memory_plan.host_memory_gib)
    if device == "cpu":
        return None
    import os

    import torch

    if not torch.cuda.is_available():
        return None
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB


def host_terms(plan: Plan) -> dict[str, int]:
    """One node's host memory need, by term."""
    roles = [r for r in plan.roles.values() if r.pool == TRAINER_POOL]
    per_gpu = sum(r.offloaded for r in roles)
    cpu_optimizer = sum(r.memory.optimizer_host for r in roles)
    terms = {f"offload copies ({plan.per_node} GPUs x {per_gpu / GIB:.1f})": plan.per_node * per_gpu}
    if cpu_optimizer:
        terms[f"CPU optimizer ({plan.per_node} GPUs x {cpu_optimizer / GIB:.1f})"] = plan.per_node * cpu_optimizer
    terms[f"worker processes ({plan.per_node} x {HOST_OVERHEAD_PER_GPU / GIB:.0f})"] = plan.per_node * HOST_OVERHEAD_PER_GPU
    return terms


def _megatron_dtype(cfg: DictConfig, role: Role) -> str:
    """The role's parameter dtype, ``auto`` resolved as MegatronEngine does."""
    dtype = value_at(cfg, f"{role.megatron}.dtype")
    if dtype == "auto":
        return "float32" if value_at(cfg, "trainer.device") == "cpu" else "bfloat16"
    return dtype


def _setup(cfg: DictConfig, typed: MegaRLConfig, role: Role) -> TrainSetup:
    from megarl.workers.megatron.optim import grad_reduce_in_fp32

    seq = value_at(cfg, "data.max_prompt_length") + value_at(cfg, "data.max_response_length")
    m = role.megatron
    section = m.rsplit(".", 1)[0]  # actor_rollout_ref.actor | actor_rollout_ref.ref | critic
    trainable = role is not REF
    if role is REF:
        fwd_dyn, fwd_tokens = value_at(cfg, f"{section}.log_prob_use_dynamic_bsz"), value_at(cfg, f"{section}.log_prob_max_token_len_per_gpu")
        fwd_micro = value_at(cfg, f"{section}.log_prob_micro_batch_size_per_gpu")
    elif role is ACTOR:
        rollout = "actor_rollout_ref.rollout"
        fwd_dyn, fwd_tokens = value_at(cfg, f"{rollout}.log_prob_use_dynamic_bsz"), value_at(cfg, f"{rollout}.log_prob_max_token_len_per_gpu")
        fwd_micro = value_at(cfg, f"{rollout}.log_prob_micro_batch_size_per_gpu")
    else:
        fwd_dyn, fwd_tokens = value_at(cfg, "critic.use_dynamic_bsz"), value_at(cfg, "critic.forward_max_token_len_per_gpu")
        fwd_micro = value_at(cfg, "critic.ppo_micro_batch_size_per_gpu")
    train_tokens = 0
    if trainable:
        if value_at(cfg, f"{section}.use_dynamic_bsz"):
            train_tokens = value_at(cfg, f"{section}.ppo_max_token_len_per_gpu")
        else:
            train_tokens = (value_at(cfg, f"{section}.ppo_micro_batch_size_per_gpu") or 1) * seq
    forward = fwd_tokens if fwd_dyn else (fwd_micro or 1) * seq
    optim_section = "actor_rollout_ref.actor.optim" if role is not CRITIC else "critic.optim"
    optim = OmegaConf.select(cfg, optim_section)
    precision_aware = bool(optim.use_precision_aware_optimizer)
    cpu_fraction = cpu_offload_fraction(optim.override_optimizer_config) if trainable else 0.0
    override = value_at(cfg, f"{m}.override_transformer_config") or {}
    return TrainSetup(
        dtype=_megatron_dtype(cfg, role), trainable=trainable, tokens=train_tokens, forward_tokens=forward,
        sequence_parallel=bool(value_at(cfg, f"{m}.sequence_parallel")),
        recompute_full=override.get("recompute_granularity") == "full",
        distributed_optimizer=bool(value_at(cfg, f"{m}.use_distributed_optimizer")),
        main_grads_dtype="fp32" if grad_reduce_in_fp32(optim) else optim.main_grads_dtype,
        exp_avg_dtype=optim.exp_avg_dtype if precision_aware else "fp32",
        exp_avg_sq_dtype=optim.exp_avg_sq_dtype if precision_aware else "fp32",
        value_head=role is CRITIC,
        megatron_fsdp=_megatron_fsdp(typed, role),
        forward_entropy=role is ACTOR,
        loss_topk=_teacher_topk(typed) if role is ACTOR else 0,
        response_share=value_at(cfg, "data.max_response_length") / seq,
        cpu_offload_fraction=cpu_fraction,
    )


def _megatron_fsdp(typed: MegaRLConfig, role: Role) -> bool:
    """``megatron.use_megatron_fsdp`` of a trained role; the reference's has no effect (verl wraps only
    trained models)."""
    sections = {ACTOR: typed.actor_rollout_ref.actor.megatron, CRITIC: typed.critic.megatron}
    return role in sections and sections[role].use_megatron_fsdp


def _teacher_topk(typed: MegaRLConfig) -> int:
    """Teacher log-probs per token the distillation loss reads: its top-k with forward_kl_topk, else 0."""
    distillation = typed.distillation
    return distillation.distillation_loss.topk if distillation.enabled and distillation.uses_topk() else 0


def _rows_per_rank(cfg: DictConfig, dp: int) -> int:
    """Rows of a step's batch (data.train_batch_size x rollout.n) on one data-parallel rank."""
    rows = value_at(cfg, "data.train_batch_size") * value_at(cfg, "actor_rollout_ref.rollout.n")
    return -(-rows // dp)


def _served_roles(cfg: DictConfig, typed: MegaRLConfig, world: int) -> list[RolePlan]:
    """The forward-only reward model and distillation teacher (megarl.workers.reward_model /
    teacher): layout from their own keys, parameters offloaded between calls per
    ``free_cache_engine``, micro-batches of ``max_num_seqs`` rows (at most a DP rank's share)."""
    out = []
    rm = typed.reward.reward_model
    if rm.enable:
        layout = ParallelLayout(world, tp=rm.rollout.tensor_model_parallel_size, pp=rm.rollout.pipeline_model_parallel_size)
        rows = min(rm.rollout.max_num_seqs, _rows_per_rank(cfg, layout.dp))
        setup = TrainSetup(dtype=_megatron_dtype(cfg, RM_ROLE), trainable=False, tokens=0,
                           forward_tokens=rows * rm.rollout.max_length(), value_head=True)
        out.append(_served(cfg, RM_ROLE, layout, setup, rm.rollout.free_cache_engine, TRAINER_POOL))
    distillation = typed.distillation
    if distillation.enabled:
        inference = distillation.teacher_models.teacher_model.inference
        own = distillation.nnodes > 0
        pool_world = distillation.nnodes * distillation.n_gpus_per_node if own else world
        layout = ParallelLayout(pool_world, tp=inference.tensor_model_parallel_size)
        seq = value_at(cfg, "data.max_prompt_length") + value_at(cfg, "data.max_response_length")
        rows = min(inference.max_num_seqs, _rows_per_rank(cfg, layout.dp))
        setup = TrainSetup(dtype=_megatron_dtype(cfg, TEACHER_ROLE), trainable=False, tokens=0,
                           forward_tokens=rows * seq, forward_topk=_teacher_topk(typed))
        out.append(_served(cfg, TEACHER_ROLE, layout, setup, inference.free_cache_engine,
                           TEACHER_POOL if own else TRAINER_POOL))
    return out


def _served(cfg: DictConfig, role: Role, layout: ParallelLayout, setup: TrainSetup, free_cache_engine: bool,
            pool: str) -> RolePlan:
    params = count_params(load_shape(value_at(cfg, role.model_path)))
    return RolePlan(role, layout, params, rank_memory(params, layout, setup), param_offload=free_cache_engine,
                    grad_offload=False, optimizer_offload=False, pool=pool)


def build_plan(cfg: DictConfig, gpu_memory_gib: float, host_memory_gib: float | None,
               typed: MegaRLConfig | None = None) -> Plan:
    """The plan of a validated, resolved config on GPUs of ``gpu_memory_gib`` GiB each and nodes
    of ``host_memory_gib`` GiB of RAM (None: the host memory is reported, not judged). ``typed``: the
    config's typed form where the caller has it (a conversion costs ~0.25 s, and every run plans)."""
    typed = typed_config(cfg) if typed is None else typed
    nnodes, per_node = value_at(cfg, "trainer.nnodes"), value_at(cfg, "trainer.n_gpus_per_node")
    world = nnodes * per_node
    active = [ACTOR] + ([REF] if need_reference(cfg) else []) + ([CRITIC] if need_critic(cfg) else [])
    roles: dict[str, RolePlan] = {}
    for role in active:
        layout = ParallelLayout.from_megatron_config(OmegaConf.select(cfg, role.megatron), world)
        params = count_params(load_shape(value_at(cfg, role.model_path)))
        trainable = role is not REF
        roles[role.name] = RolePlan(
            role, layout, params, rank_memory(params, layout, _setup(cfg, typed, role)),
            param_offload=bool(value_at(cfg, f"{role.megatron}.param_offload")),
            grad_offload=trainable and bool(value_at(cfg, f"{role.megatron}.grad_offload")),
            optimizer_offload=trainable and bool(value_at(cfg, f"{role.megatron}.optimizer_offload")),
        )
    roles.update((r.role.name, r) for r in _served_roles(cfg, typed, world))
    rollout = "actor_rollout_ref.rollout"
    gpu_bytes = int(gpu_memory_gib * GIB)
    rollout_dtype = value_at(cfg, f"{rollout}.dtype")
    rollout_dtype = "bfloat16" if rollout_dtype == "auto" else rollout_dtype
    rollout_tp = value_at(cfg, f"{rollout}.tensor_model_parallel_size")
    plan = Plan(nnodes, per_node, gpu_bytes, roles, rollout_tp,
                vllm_memory(roles["actor"].params, rollout_tp, rollout_dtype, gpu_bytes,
                            value_at(cfg, f"{rollout}.gpu_memory_utilization")),
                vllm_awake_in_training=not value_at(cfg, f"{rollout}.free_cache_engine"),
                bucket_bytes=int(value_at(cfg, f"{rollout}.weight_sync.bucket_size_mb") * MIB),
                host_bytes=None if host_memory_gib is None else int(host_memory_gib * GIB))
    if roles.get("teacher") is not None and roles["teacher"].pool == TEACHER_POOL:
        plan.teacher_pool = (value_at(cfg, "distillation.nnodes"), value_at(cfg, "distillation.n_gpus_per_node"))
    plan.actor_forward = not typed.algorithm.rollout_correction.bypass_mode
    if typed.trainer.trainer_mode() == "separate_async":
        plan.rollout_pool = (value_at(cfg, f"{rollout}.nnodes"), value_at(cfg, f"{rollout}.n_gpus_per_node"))
    plan.phases = phases(plan)
    plan.issues = _fit_issues(plan, cfg, gpu_memory_gib)
    return plan


def _phase(terms: dict[str, int], role: str | None, overhead: dict[str, int], pool: str = TRAINER_POOL) -> Phase:
    return Phase({**terms, "overhead": sum(overhead.values())}, role, pool, overhead)


def phases(plan: Plan) -> dict[str, Phase]:
    """Every phase's terms (see the module docstring)."""
    roles = {name: r for name, r in plan.roles.items() if r.pool == TRAINER_POOL}
    vllm_here = plan.rollout_pool is None  # separate_async: the engines are on their own GPUs
    further = sum(r.role is CRITIC or r.role in SERVED for r in roles.values())

    def overhead(vllm_asleep: bool) -> dict[str, int]:
        return trainer_overhead(expert_parallel=roles["actor"].layout.ep > 1, vllm_asleep=vllm_here and vllm_asleep,
                                further_processes=further)

    own_pool = {"its own process": OWN_POOL}
    asleep_in_training = not plan.vllm_awake_in_training

    def others(name: str | None) -> dict[str, int]:
        out: dict[str, int] = {}
        for other, r in roles.items():
            if other != name:
                out.update(r.kept())
        return out

    out: dict[str, Phase] = {}
    built: dict[str, int] = {}
    init: Phase | None = None
    for name in (n for n in BUILD_ORDER if n in roles):  # before vLLM starts
        step = _phase({**built, **roles[name].whole()}, name, overhead(vllm_asleep=False))
        if init is None or step.total > init.total:
            init = step
        built.update(roles[name].kept())
    assert init is not None
    out["init"] = init
    actor = roles["actor"]
    buckets = ({"weight-sync buckets (2: vLLM's reload)": 2 * plan.bucket_bytes} if actor.params.expert_params
               else {"weight-sync bucket": plan.bucket_bytes})
    out["sync"] = _phase({**actor.kept(params_onloaded=True), **actor.fsdp_gathered("sync"), **({"vLLM weights": plan.vllm.weights} if vllm_here else {}),
                          **buckets, **others("actor")}, "actor", overhead(vllm_asleep=True))
    if vllm_here:
        out["generate"] = _phase({"vLLM budget": plan.vllm.budget, **others(None)}, None, overhead(vllm_asleep=False))
    else:
        out["generate"] = _phase({"vLLM budget": plan.vllm.budget, "weight-push bucket": plan.bucket_bytes}, None,
                                 own_pool, ROLLOUT_POOL)
    asleep = ({"vLLM (awake: free_cache_engine=false)": plan.vllm.budget}
              if plan.vllm_awake_in_training and vllm_here else {})
    for name, r in roles.items():
        if name == "actor" and not plan.actor_forward:
            continue
        out[FORWARD_PHASE[name]] = _phase({**r.kept(params_onloaded=True), **r.fsdp_gathered("forward"),
                                           f"{name} activations (forward)": r.memory.activations_forward,
                                           **others(name), **asleep}, name,
                                          overhead(vllm_asleep=asleep_in_training))
    for name, r in plan.roles.items():
        if r.pool != TRAINER_POOL:  # alone on its GPUs
            out[FORWARD_PHASE[name]] = _phase({**r.kept(params_onloaded=True), f"{name} activations (forward)":
                                               r.memory.activations_forward}, name, own_pool, r.pool)
    for name, r in roles.items():
        if r.memory.grads:
            where = f", {r.memory.train_peak_stage} pipeline stage" if r.memory.train_peak_stage else ""
            out[f"update_{name}"] = _phase({**r.whole(), **r.fsdp_gathered("train"), f"{name} activations (train{where})": r.memory.activations_train,
                                            **others(name), **asleep}, name, overhead(vllm_asleep=asleep_in_training))
    return out


def _fit_issues(plan: Plan, cfg: DictConfig, gib: float) -> list[Issue]:
    issues = []
    seq = value_at(cfg, "data.max_prompt_length") + value_at(cfg, "data.max_response_length")
    rollout = "actor_rollout_ref.rollout"
    if plan.vllm.kv_tokens < seq:
        issues.append(Issue(f"{rollout}.gpu_memory_utilization", value_at(cfg, f"{rollout}.gpu_memory_utilization"),
                            f"vLLM's budget ({plan.vllm.budget / GIB:.1f} GiB) leaves {plan.vllm.kv_cache / GIB:.2f} GiB of KV cache "
                            f"after {plan.vllm.weights / GIB:.1f} GiB of weights: {plan.vllm.kv_tokens} tokens, less than one "
                            f"sequence of {seq}",
                            f"raise {rollout}.gpu_memory_utilization or {rollout}.tensor_model_parallel_size"))
    cluster = "trainer.nnodes / trainer.n_gpus_per_node"
    host_need = sum(host_terms(plan).values())
    if plan.host_bytes is not None and host_need > plan.host_bytes:
        offloading = [key for r in plan.roles.values() if r.pool == TRAINER_POOL
                      for key, on in ((r.param_offload_key, r.param_offload),
                                      (f"{r.role.megatron}.optimizer_offload", r.optimizer_offload and bool(r.memory.optimizer)),
                                      (f"{r.optim_section}.override_optimizer_config.optimizer_offload_fraction",
                                       bool(r.memory.optimizer_host))) if on]
        issues.append(Issue("trainer.memory_plan.host_memory_gib", round(plan.host_bytes / GIB, 1),
                            f"a node needs {host_need / GIB:.1f} GiB of host memory (the page-locked copies of what its "
                            f"{plan.per_node} GPUs offload, " + ("the CPU optimizer's state, " if any(
                                r.memory.optimizer_host for r in plan.roles.values()) else "")
                            + f"and their worker processes), the node has {plan.host_bytes / GIB:.1f}",
                            "offload less (" + ", ".join(offloading) + "), put fewer GPUs on a node "
                            "(trainer.n_gpus_per_node), or set trainer.memory_plan.host_memory_gib to the nodes' RAM "
                            "if it is not this machine's"))
    teacher = plan.roles.get("teacher")
    move_teacher = "distillation.nnodes > 0 with distillation.n_gpus_per_node (the teacher on its own GPUs)"
    for name, phase in plan.phases.items():
        if phase.total <= plan.gpu_bytes:
            continue
        where = (f"phase {name} needs {phase.total / GIB:.1f} GiB per GPU, the GPU has {gib:g} GiB "
                 "(trainer.memory_plan.gpu_memory_gib)")
        offload_others = [] if phase.pool != TRAINER_POOL else [
            key for o in plan.roles.values() if o.role.name != phase.role and o.pool == TRAINER_POOL
            for key, missing in ((o.param_offload_key, not o.param_offload),
                                 (f"{o.role.megatron}.optimizer_offload", bool(o.memory.grads) and not o.optimizer_offload))
            if missing]
        if teacher is not None and teacher.pool == TRAINER_POOL and phase.pool == TRAINER_POOL and (
                phase.role == "teacher" or teacher.between_phases):
            offload_others.append(move_teacher)
        if phase.role is None:  # generate
            fix = [f"{rollout}.gpu_memory_utilization"] + offload_others
            issues.append(Issue(f"{rollout}.gpu_memory_utilization", value_at(cfg, f"{rollout}.gpu_memory_utilization"),
                                where, "lower or offload: " + ", ".join(fix)))
            continue
        r = plan.roles[phase.role]
        m = r.role.megatron
        section = m.rsplit(".", 1)[0]
        fix = [f"{m}.tensor_model_parallel_size"] + ([] if r.role is TEACHER_ROLE else [f"{m}.pipeline_model_parallel_size"])
        if name == "sync":
            fix += [f"{rollout}.tensor_model_parallel_size", f"{rollout}.weight_sync.bucket_size_mb"]
            fix += [f"{m}.{k}" for k, on in (("param_offload", r.param_offload), ("optimizer_offload", r.optimizer_offload))
                    if not on]
        elif name.startswith("update"):
            fix += [f"{section}.ppo_micro_batch_size_per_gpu (or ppo_max_token_len_per_gpu with use_dynamic_bsz)",
                    f"{m}.override_transformer_config.recompute_granularity=full"]
            if r.memory.optimizer != r.memory.optimizer_sharded:
                fix.append(f"{m}.use_distributed_optimizer=true")
            cpu_optimizer = f"{r.optim_section}.override_optimizer_config"
            fix.append(f"{cpu_optimizer}.optimizer_offload_fraction (higher)" if r.memory.optimizer_host else
                       f"Megatron's CPU optimizer ({cpu_optimizer}.optimizer_cpu_offload=true, optimizer_offload_fraction=1, "
                       f"{r.optim_section}.use_precision_aware_optimizer=true)")
        elif name != "init":
            fix.append(f"{m}.max_num_seqs" if r.role in SERVED else "the log-prob micro-batch size")
        gpus = cluster if r.pool == TRAINER_POOL else "distillation.nnodes / distillation.n_gpus_per_node"
        issues.append(Issue(f"{m}.tensor_model_parallel_size", r.layout.tp, where,
                            "change " + ", ".join(fix + offload_others) + f", or {gpus}"))
    return issues
