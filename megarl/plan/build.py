"""The launch plan of a resolved config: placement, memory per role and phase, and its verdict.

Phases on one GPU (every role is colocated on every slot, see :mod:`megarl.plan.placement`):
``generate`` (vLLM's budget + what the Megatron roles keep resident: their parameters and
gradients unless ``param_offload``, their optimizer state unless ``optimizer_offload``),
then ``old_log_prob`` / ``ref_log_prob`` / ``values`` (one role's forward, vLLM asleep when
``rollout.free_cache_engine``), ``update_critic`` and ``update_actor`` (the trained role's
whole state loaded + its activations). The plan refuses when a phase exceeds the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import DictConfig

from megarl.config.errors import Issue
from megarl.config.roles import ACTOR, CRITIC, REF, Role, need_critic, need_reference
from megarl.config.view import value_at
from megarl.parallel.layout import ParallelLayout
from megarl.plan.memory import RankMemory, TrainSetup, VllmMemory, rank_memory, vllm_memory
from megarl.plan.model_size import ParamCount, count_params, load_shape

__all__ = ["Plan", "RolePlan", "build_plan"]

GIB = 2**30
FORWARD_PHASE = {"actor": "old_log_prob", "ref": "ref_log_prob", "critic": "values"}


@dataclass(frozen=True)
class RolePlan:
    role: Role
    layout: ParallelLayout
    params: ParamCount
    memory: RankMemory
    param_offload: bool
    optimizer_offload: bool

    @property
    def between_phases(self) -> int:
        """Bytes it keeps on the GPU while another phase runs."""
        m = self.memory
        return (0 if self.param_offload else m.params + m.grads) + (0 if self.optimizer_offload else m.optimizer)


@dataclass
class Plan:
    nnodes: int
    per_node: int
    gpu_bytes: int
    roles: dict[str, RolePlan]
    rollout_tp: int
    vllm: VllmMemory
    vllm_awake_in_training: bool
    phases: dict[str, int] = field(default_factory=dict)
    issues: list[Issue] = field(default_factory=list)


def _megatron_dtype(cfg: DictConfig, role: Role) -> str:
    dtype = value_at(cfg, f"{role.megatron}.dtype")
    if dtype == "auto":
        return "float32" if value_at(cfg, "trainer.device") == "cpu" else "bfloat16"
    return dtype


def _setup(cfg: DictConfig, role: Role) -> TrainSetup:
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
    optim = cfg_node(cfg, optim_section)
    precision_aware = bool(optim.use_precision_aware_optimizer)
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
    )


def cfg_node(cfg: DictConfig, key: str):
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, key)


def build_plan(cfg: DictConfig, gpu_memory_gib: float) -> Plan:
    """The plan of a validated, resolved config on GPUs of ``gpu_memory_gib`` GiB each."""
    nnodes, per_node = value_at(cfg, "trainer.nnodes"), value_at(cfg, "trainer.n_gpus_per_node")
    world = nnodes * per_node
    active = [ACTOR] + ([REF] if need_reference(cfg) else []) + ([CRITIC] if need_critic(cfg) else [])
    roles: dict[str, RolePlan] = {}
    for role in active:
        layout = ParallelLayout.from_megatron_config(cfg_node(cfg, role.megatron), world)
        params = count_params(load_shape(value_at(cfg, role.model_path)))
        trainable = role is not REF
        roles[role.name] = RolePlan(
            role, layout, params, rank_memory(params, layout, _setup(cfg, role)),
            param_offload=bool(value_at(cfg, f"{role.megatron}.param_offload")),
            optimizer_offload=trainable and bool(value_at(cfg, f"{role.megatron}.optimizer_offload")),
        )
    rollout = "actor_rollout_ref.rollout"
    gpu_bytes = int(gpu_memory_gib * GIB)
    rollout_dtype = value_at(cfg, f"{rollout}.dtype")
    rollout_dtype = "bfloat16" if rollout_dtype == "auto" else rollout_dtype
    plan = Plan(nnodes, per_node, gpu_bytes, roles, value_at(cfg, f"{rollout}.tensor_model_parallel_size"),
                vllm_memory(roles["actor"].params, value_at(cfg, f"{rollout}.tensor_model_parallel_size"), rollout_dtype,
                            gpu_bytes, value_at(cfg, f"{rollout}.gpu_memory_utilization")),
                vllm_awake_in_training=not value_at(cfg, f"{rollout}.free_cache_engine"))
    _phases(plan)
    plan.issues = _fit_issues(plan, cfg, gpu_memory_gib)
    return plan


def _phases(plan: Plan) -> None:
    resident = {name: r.between_phases for name, r in plan.roles.items()}
    idle = sum(resident.values())
    vllm_idle = plan.vllm.budget if plan.vllm_awake_in_training else 0
    plan.phases["generate"] = plan.vllm.budget + idle
    for name, r in plan.roles.items():
        others = idle - resident[name] + vllm_idle
        # A forward loads the role's parameters (not its gradients or optimizer state).
        loaded = resident[name] + (r.memory.params if r.param_offload else 0)
        plan.phases[FORWARD_PHASE[name]] = others + loaded + r.memory.activations_forward
        if r.memory.grads:
            plan.phases[f"update_{name}"] = others + r.memory.resident + r.memory.activations_train


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
    for phase, need in plan.phases.items():
        if need <= plan.gpu_bytes:
            continue
        where = f"phase {phase} needs {need / GIB:.1f} GiB per GPU, the GPU has {gib:g} GiB (--gpu-memory-gib)"
        if phase == "generate":
            keys = [f"{rollout}.gpu_memory_utilization"] + [f"{r.role.megatron}.{k}" for r in plan.roles.values()
                                                            for k in ("param_offload", "optimizer_offload") if r.memory.grads or k == "param_offload"]
            issues.append(Issue(f"{rollout}.gpu_memory_utilization", value_at(cfg, f"{rollout}.gpu_memory_utilization"), where,
                                "lower or offload: " + ", ".join(dict.fromkeys(keys))))
            continue
        name = next(n for n in plan.roles if phase.endswith(n) or phase == FORWARD_PHASE[n])
        r = plan.roles[name]
        m = r.role.megatron
        section = m.rsplit(".", 1)[0]
        fix = [f"{m}.tensor_model_parallel_size", f"{m}.pipeline_model_parallel_size"]
        if phase.startswith("update"):
            fix += [f"{section}.ppo_micro_batch_size_per_gpu (or ppo_max_token_len_per_gpu with use_dynamic_bsz)",
                    f"{m}.override_transformer_config.recompute_granularity=full"]
            if r.memory.optimizer != r.memory.optimizer_sharded:
                fix.append(f"{m}.use_distributed_optimizer=true")
        else:
            fix.append("the log-prob micro-batch size")
        others = [f"{o.role.megatron}.param_offload" for o in plan.roles.values() if o is not r and not o.param_offload]
        issues.append(Issue(f"{m}.tensor_model_parallel_size", r.layout.tp, where,
                            "change " + ", ".join(fix + others) + ", or trainer.nnodes / trainer.n_gpus_per_node"))
    return issues
