"""Rank bodies for the MoE routing-replay tests (spawned by run_distributed).

The observation is independent of megarl's replay code: a forward hook on every megatron ``TopKRouter``
keeps the routing map it returns (``[tokens, experts]`` bool, tokens in megatron's own order), and
:func:`routes_by_position` maps it back to ``(row, position)`` from first principles (rows front-aligned,
``[s, b]`` flattened sequence-major, under sequence parallelism TP rank r holds the r-th contiguous part of s).
"""

from __future__ import annotations

import torch

PROMPT, RESPONSE = 8, 6


def _observe(chunks) -> list[tuple[int, torch.Tensor]]:
    """(layer_number, routing map) of every router call on ``chunks``, in call order."""
    from megatron.core.transformer.moe.router import TopKRouter

    seen: list[tuple[int, torch.Tensor]] = []
    for chunk in chunks:
        for module in chunk.modules():
            if isinstance(module, TopKRouter):
                module.register_forward_hook(
                    lambda m, args, out: seen.append((m.layer_number, out[1].detach().cpu().clone())))
    return seen


def routes_by_position(seen, attention_mask: torch.Tensor, moe_layers: list[int], top_k: int, packed: bool,
                       tp_rank: int = 0, tp: int = 1, cp_rank: int = 0, cp: int = 1) -> torch.Tensor:
    """The experts each valid token of ``attention_mask`` ``[b, S]`` went to, from one forward's routing maps
    (one micro-batch): ``[b, S, MoE layers, top-k]`` (-1 where padded or not seen on this rank). Padded layout:
    rows front-aligned to the longest (rounded up to tp, or 2 cp), megatron's tokens ``[s, b]``; packed: the
    rows' tokens back to back, one sequence of ``[T, 1]`` (T rounded up to tp). Under context parallelism
    (padded) CP rank r holds chunks r and 2cp-1-r of the 2cp equal chunks of s."""
    b, seq = attention_mask.shape
    lengths = [int(n) for n in attention_mask.sum(-1)]
    where = [attention_mask[i].nonzero().flatten().tolist() for i in range(b)]
    if packed:  # token t of the packed row -> (row, position)
        assert cp == 1
        tokens = [(i, where[i][j]) for i in range(b) for j in range(lengths[i])]
        total = -(-len(tokens) // tp) * tp
        tokens += [None] * (total - len(tokens))
        order = tokens[tp_rank * total // tp:(tp_rank + 1) * total // tp]
    else:
        multiple = tp * 2 * cp if cp > 1 else tp
        length = -(-max(lengths) // multiple) * multiple
        chunk = length // (2 * cp)
        steps = list(range(length)) if cp == 1 else [*range(cp_rank * chunk, (cp_rank + 1) * chunk),
                                                     *range((2 * cp - 1 - cp_rank) * chunk, (2 * cp - cp_rank) * chunk)]
        steps = steps[tp_rank * len(steps) // tp:(tp_rank + 1) * len(steps) // tp]
        order = [(i, where[i][s]) if s < lengths[i] else None for s in steps for i in range(b)]
    out = torch.full((b, seq, len(moe_layers), top_k), -1, dtype=torch.long)
    for layer_number, routing_map in seen:
        layer = moe_layers.index(layer_number - 1)
        assert routing_map.shape[0] == len(order), (routing_map.shape, len(order), attention_mask.shape, layer_number, len(seen))
        for token, chosen in zip(order, routing_map):
            experts = chosen.nonzero().flatten()
            assert len(experts) == top_k, f"token routed to {experts.tolist()}"
            if token is not None:
                out[token[0], token[1], layer] = experts
    return out


def _sorted(routes: torch.Tensor) -> torch.Tensor:
    return routes.long().sort(-1).values


def _perturb_routers(chunks, seed: int) -> None:
    """Change every megatron router's weights (vLLM keeps its own): native routing now differs from vLLM's."""
    from megatron.core.transformer.moe.router import TopKRouter

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for chunk in chunks:
            for module in chunk.modules():
                if isinstance(module, TopKRouter):
                    module.weight.add_(torch.randn(module.weight.shape, generator=gen) * module.weight.std() * 0.5)


def replay_pass(hf_dir: str, overrides: dict, prompt_rows: list[list[int]]) -> dict:
    """The colocated worker with R3 (or R2, per ``overrides``): generate (vLLM routes recorded under R3),
    perturb megatron's routers (actor and reference alike), then the old-log-prob pass, the reference pass and
    one update, each observed by router hooks (R2: the routers are perturbed again after the old-log-prob
    pass). Returns per rank the batch's routes (vLLM's, or R2's recorded), each pass's observed routes, the
    rollout/actor log-prob gaps of the replaying actor and the native reference, and the metrics."""
    from helpers.tiny_hf import actor_rollout_ref_config, left_padded_prompts

    from megarl.models.moe_config import moe_layers
    from megarl.parallel.layout import ParallelLayout
    from megarl.protocol import DataProto
    from megarl.workers.hybrid import ActorRolloutRefWorker
    from megatron.core import parallel_state

    cfg = actor_rollout_ref_config(hf_dir, PROMPT, RESPONSE, **overrides)
    worker = ActorRolloutRefWorker(cfg, role="actor_rollout_ref", device="cpu")
    worker.init_model()
    local = worker.generate_sequences(left_padded_prompts(prompt_rows, PROMPT), validate=False, do_sample=True)
    world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
    replicas = ParallelLayout(world_size=world, tp=int(cfg.rollout.tensor_model_parallel_size))
    parts = [None] * world
    torch.distributed.all_gather_object(parts, (replicas.coordinates(rank).tp == 0, local))
    sampled = DataProto.concat([part for first, part in parts if first])
    dp, dp_rank = parallel_state.get_data_parallel_world_size(), parallel_state.get_data_parallel_rank()
    mine = sampled.chunk(dp)[dp_rank]
    hf = worker.actor.engine.hf_config
    layers, top_k = moe_layers(hf), int(hf.num_experts_per_tok)
    tp, tp_rank = parallel_state.get_tensor_model_parallel_world_size(), parallel_state.get_tensor_model_parallel_rank()
    sp = bool(cfg.actor.megatron.sequence_parallel) and tp > 1
    observe = dict(moe_layers=layers, top_k=top_k, packed=bool(cfg.model.use_remove_padding),
                   tp_rank=tp_rank if sp else 0, tp=tp if sp else 1,
                   cp_rank=parallel_state.get_context_parallel_rank(), cp=parallel_state.get_context_parallel_world_size())

    for role in (worker.actor, worker.ref):
        _perturb_routers(role.engine.unwrapped_chunks(), seed=7)
    actor_seen = _observe(worker.actor.engine.unwrapped_chunks())
    ref_seen = _observe(worker.ref.engine.unwrapped_chunks())
    scored = worker.compute_log_prob(mine)
    old_pass = routes_by_position(list(actor_seen), mine.batch["attention_mask"], **observe)
    actor_seen.clear()
    if "routed_experts" in scored.batch.keys():  # R2: the old-log-prob pass recorded its routes
        mine.batch["routed_experts"] = scored.batch["routed_experts"]
        for role in (worker.actor, worker.ref):  # as an optimizer step would: the update must still replay them
            _perturb_routers(role.engine.unwrapped_chunks(), seed=8)
    ref = worker.compute_ref_log_prob(mine)
    ref_pass = routes_by_position(ref_seen, mine.batch["attention_mask"], **observe)
    mine.batch["old_log_probs"] = scored.batch["old_log_probs"]
    mine.batch["ref_log_prob"] = ref.batch["ref_log_prob"]
    mine.batch["advantages"] = torch.randn(mine.batch["responses"].shape) * mine.batch["response_mask"]
    mine.meta_info.update(nan_policy="stop", global_step=1)
    update_metrics = worker.update_actor(mine)
    update_pass = routes_by_position(actor_seen, mine.batch["attention_mask"], **observe)
    worker.shutdown()
    mask = mine.batch["response_mask"].bool()
    gap = {name: (mine.batch["rollout_log_probs"] - mine.batch[key]).abs()[mask]
           for name, key in (("replayed", "old_log_probs"), ("native", "ref_log_prob"))}
    return {
        "gap": gap,
        "routes": mine.batch["routed_experts"].clone() if "routed_experts" in mine.batch.keys() else None,
        "attention_mask": mine.batch["attention_mask"].clone(),
        "old_pass": old_pass, "ref_pass": ref_pass, "update_pass": update_pass,
        "old_metrics": scored.meta_info.get("metrics", {}), "ref_metrics": ref.meta_info.get("metrics", {}),
        "update_metrics": update_metrics, "rollout_metrics": local.meta_info.get("metrics", {}),
        "observed_tp": observe["tp"], "tp_rank": tp_rank,
    }


def compare(observed: torch.Tensor, routes: torch.Tensor) -> tuple[int, int, int]:
    """(positions compared, equal, routed without a route) over the valid token-layer rows ``observed`` saw:
    a row with a route compares its expert set, one without (-1) only counts."""
    seen = (observed >= 0).all(-1)
    has_route = (routes >= 0).all(-1)
    both = seen & has_route
    equal = (_sorted(observed) == _sorted(routes)).all(-1) & both
    return int(both.sum()), int(equal.sum()), int((seen & ~has_route).sum())


def unrouted_positions(observed: torch.Tensor, routes: torch.Tensor, attention_mask: torch.Tensor) -> set[str]:
    """What the valid token-layer rows ``observed`` saw without a route are: "last" (a row's last token) or
    "other" (anything else)."""
    missing = (observed >= 0).all(-1) & ~(routes >= 0).all(-1)  # [b, S, layers]
    last = torch.zeros_like(attention_mask, dtype=torch.bool)
    last[torch.arange(len(last)), (attention_mask * torch.arange(1, attention_mask.shape[1] + 1)).argmax(-1)] = True
    return {"last" if last[row, pos] else "other" for row, pos, _ in missing.nonzero().tolist()}


def moe_health_pass(hf_dir: str, megatron: dict, batch: dict) -> dict:
    """The actor's old-log-prob pass on this rank's data-parallel rows of ``batch``: its ``moe/*`` metrics."""
    from helpers.tiny import actor_rollout_ref_config, dp_rows, worker_data

    from megarl.workers.actor import ActorWorker

    actor = ActorWorker(actor_rollout_ref_config(hf_dir, megatron), "actor", device="cpu")
    actor.init_model()
    out = actor.compute_log_prob(worker_data(batch, dp_rows(batch)))
    return {k: v for k, v in out.meta_info["metrics"].items() if k.startswith("moe/")}


def hf_moe_health(hf_dir: str, batch: dict) -> dict[str, float]:
    """The ``moe/*`` metrics (megarl.workers.megatron.moe_health's definitions) from HF transformers' own router
    logits on every valid token of ``batch``: the independent reference."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    layers = [i for i in range(config.num_hidden_layers) if i not in (config.mlp_only_layers or [])]
    logits: dict[int, list[torch.Tensor]] = {i: [] for i in layers}
    for i in layers:
        model.model.layers[i].mlp.gate.register_forward_hook(
            lambda m, args, out, i=i: logits[i].append(out[0] if isinstance(out, tuple) else out))
    with torch.no_grad():
        for ids, mask in zip(batch["input_ids"], batch["attention_mask"]):
            model(ids[mask.bool()][None])
    e, k = config.num_experts, config.num_experts_per_tok
    ratio, aux, entropy = [], [], []
    for i in layers:
        z = torch.cat([x.view(-1, e) for x in logits[i]]).double()
        p = z.softmax(-1)
        n = torch.zeros(e, dtype=torch.float64).index_add_(0, z.topk(k, -1).indices.flatten(), torch.ones(z.shape[0] * k, dtype=torch.float64))
        ratio.append(n.max() / n.mean())
        aux.append(e / (k * z.shape[0] ** 2) * (p.sum(0) * n).sum())
        entropy.append(-(p * p.log()).sum(-1).mean())
    return {"moe/expert_load_max_over_mean/mean": float(torch.stack(ratio).mean()),
            "moe/expert_load_max_over_mean/max": float(torch.stack(ratio).max()),
            "moe/load_balancing_loss/mean": float(torch.stack(aux).mean()),
            "moe/load_balancing_loss/max": float(torch.stack(aux).max()),
            "moe/router_entropy/mean": float(torch.stack(entropy).mean())}
