"""The plan as text: placement, groups, memory per role and per phase, verdict."""

from __future__ import annotations

from megarl.plan.build import GIB, MIB, TRAINER_POOL, Phase, Plan, host_terms
from megarl.plan.placement import group_lines, node_lines, slot_lines

DETAILED_NODES = 2  # up to this many nodes the placement is listed per GPU


def _g(n: int) -> str:
    return f"{n / GIB:.2f}"


def _term(phase: Phase, term: str, size: int) -> str:
    """``term size``; the overhead with its parts."""
    if term != "overhead" or not phase.overhead_parts:
        return f"{term} {_g(size)}"
    return f"{term} {_g(size)} (" + " + ".join(f"{part} {_g(n)}" for part, n in phase.overhead_parts.items()) + ")"


def format_plan(plan: Plan, notes: tuple[str, ...] | list[str] = ()) -> str:
    """The plan as text; ``notes``: lines on how it was made (checks skipped, packages judged)."""
    world = plan.nnodes * plan.per_node
    out = [f"megarl plan: {plan.nnodes} node(s) x {plan.per_node} GPU(s) = {world} ranks, "
           f"{plan.gpu_bytes / GIB:g} GiB per GPU; every role is colocated on every GPU"
           + (" but the teacher" if plan.teacher_pool else "") + (" but vLLM" if plan.rollout_pool else "")]
    out += [f"note: {note}" for note in notes]
    if "reward_model" in plan.roles:
        out.append("reward: the reward model (reward.reward_model) on every GPU, scoring after generation")
    else:
        out.append("reward: the reward function runs in the driver process (node 0), no GPU")
    if plan.teacher_pool:
        nodes, gpus = plan.teacher_pool
        out.append(f"teacher: its own pool of {nodes} node(s) x {gpus} GPU(s) (distillation.nnodes > 0), "
                   f"{plan.gpu_bytes / GIB:g} GiB per GPU")
    layouts = {name: r.layout for name, r in plan.roles.items() if r.pool == TRAINER_POOL}
    if plan.rollout_pool:
        nodes, gpus = plan.rollout_pool
        out.append(f"rollout: {nodes * gpus} vLLM engine(s) of TP={plan.rollout_tp}, one per GPU of their own pool of "
                   f"{nodes} node(s) x {gpus} GPU(s) (trainer.v1.trainer_mode=separate_async), {plan.gpu_bytes / GIB:g} GiB per GPU")
    else:
        out.append(f"rollout: {world // plan.rollout_tp} vLLM replica(s) of TP={plan.rollout_tp}")
    replica_tp = None if plan.rollout_pool else plan.rollout_tp
    out.append("")
    detailed = plan.nnodes <= DETAILED_NODES
    if detailed:
        out.append("placement (node, GPU -> coordinates):")
        out += ["  " + line for line in slot_lines(plan.nnodes, plan.per_node, layouts, replica_tp)]
    else:
        out.append("placement per run of alike nodes (coordinates; DP indices and replicas shift node to node):")
        out += ["  " + line for line in node_lines(plan.nnodes, plan.per_node, layouts, replica_tp)]
    out.append("")
    for name, r in plan.roles.items():
        out += group_lines(name, r.layout, compact=not detailed)
    out.append("")
    out.append("memory per GPU, GiB (estimate; see megarl/plan/memory.py for the model):")
    out.append(f"  {'role':<13}{'params(B)':>10}{'weights':>9}{'grads':>8}{'optim':>8}{'optim unsharded':>16}"
               f"{'optim on host':>14}{'offloaded between phases':>26}{'act train':>11}{'act fwd':>9}")
    for name, r in plan.roles.items():
        m = r.memory
        offload = r.offloaded
        out.append(f"  {name:<13}{r.params.total / 1e9:>10.3f}{_g(m.params):>9}{_g(m.grads):>8}{_g(m.optimizer):>8}"
                   f"{_g(m.optimizer_full):>16}{_g(m.optimizer_host):>14}{_g(offload):>26}{_g(m.activations_train):>11}"
                   f"{_g(m.activations_forward):>9}")
    v = plan.vllm
    out.append(f"  vLLM: budget {_g(v.budget)} = weights {_g(v.weights)} + KV cache {_g(v.kv_cache)} "
               f"({v.kv_tokens} tokens at {v.kv_bytes_per_token} B/token"
               + (f", beside one sequence's Mamba state of {v.state_bytes_per_sequence / MIB:.1f} MiB"
                  if v.state_bytes_per_sequence else "") + ")")
    out.append("")
    out.append("peak per phase, GiB per GPU (= its terms, megarl/plan/build.py; overhead: the memory outside them, "
               "fitted to the GPU runs' device memory in use, megarl/plan/overhead.py):")
    for name, phase in plan.phases.items():
        flag = "  <-- does not fit" if phase.total > plan.gpu_bytes else ""
        terms = " + ".join(_term(phase, term, size) for term, size in phase.terms.items())
        pool = "" if phase.pool == TRAINER_POOL else f" (on the {phase.pool} pool's GPUs)"
        out.append(f"  {name:<16}{_g(phase.total):>8} = {terms}{pool}{flag}")
    host = host_terms(plan)
    out.append(f"  {'host (node)':<16}{_g(sum(host.values())):>8} = "
               + " + ".join(f"{term} {_g(size)}" for term, size in host.items())
               + (f" of {_g(plan.host_bytes)} GiB (trainer.memory_plan.host_memory_gib)" if plan.host_bytes is not None
                  else " (not judged: set trainer.memory_plan.host_memory_gib to the nodes' RAM)"))
    peak = max(phase.total for phase in plan.phases.values())
    out.append("")
    if plan.issues:
        out.append(f"REFUSED: {len(plan.issues)} problem(s):")
        out += ["  " + issue.format() for issue in plan.issues]
    else:
        out.append(f"fits: peak {_g(peak)} of {plan.gpu_bytes / GIB:g} GiB per GPU")
    return "\n".join(out)
