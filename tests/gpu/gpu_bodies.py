"""Rank bodies of the GPU tests (CUDA + NCCL; spawned by dist_utils.run_distributed).

Each body runs on 2 GPUs (one process each) and returns CPU tensors from rank 0.
"""

from __future__ import annotations

import os

import torch

from helpers.tiny import actor_rollout_ref_config, dp_rows, megatron_node, worker_data


def actor_log_probs_and_step(model_path: str, batch: dict, tp: int, dtype: str, device: str = "cuda") -> dict:
    """Log-probs of this rank's DP rows, then one PPO step; HF export after it (rank 0)."""
    from megarl.workers.actor import ActorWorker

    # megatron-core (0.16.1; on 0.19.2 to be re-checked on a GPU) without transformer-engine/apex builds
    # its distributed optimizer only for bf16/fp16 params (fp32 params get torch Adam, which it rejects), so this
    # fp32 comparison uses the plain (replicated) optimizer.
    megatron = megatron_node(tensor_model_parallel_size=tp, dtype=dtype, use_distributed_optimizer=dtype != "float32")
    megatron["override_transformer_config"] = {"attention_backend": "auto"}  # no flash-attn package on the GPU machine
    cfg = actor_rollout_ref_config(model_path, megatron)
    actor = ActorWorker(cfg, "actor", device=device)
    actor.init_model()
    rows = dp_rows(batch)
    data = worker_data(batch, rows)
    out = actor.compute_log_prob(data)
    result = {
        "rows": (rows.start, rows.stop),
        "log_probs": out.batch["old_log_probs"].cpu(),
        "entropys": out.batch["entropys"].cpu(),
        "metrics": actor.update_policy(data),
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
    }
    exported = {name: t.detach().float().cpu() for name, t in actor.export_hf_weights()}
    result["updated"] = exported if torch.distributed.get_rank() == 0 else None
    return result


def weight_sync_bitwise(model_path: str, bucket_bytes: int, device: str = "cuda") -> dict:
    """TP=2 bf16 model loaded from `model_path`: per-tensor export, bucketed export,
    in-process stream (checked) and NCCL broadcast stream, all as CPU tensors (rank 0/1)."""
    import transformers
    import torch.distributed as dist

    from megarl.models import build_model, export_hf_weights, load_hf_weights
    from megarl.parallel import init_distributed
    from megarl.weight_sync import build_plan, stream_broadcast, stream_in_process
    from megarl.weight_sync.tp_gather import export_hf_weights_bucketed

    layout = init_distributed({"tensor_model_parallel_size": 2}, device, seed=42)
    hf_config = transformers.AutoConfig.from_pretrained(model_path)
    chunks = build_model(hf_config, {"tensor_model_parallel_size": 2}, device=device, dtype=torch.bfloat16)
    load_hf_weights(chunks, model_path)

    def to_cpu(stream):
        return {name: t.detach().cpu().clone() for name, t in stream}

    per_tensor = to_cpu(export_hf_weights(chunks, hf_config))
    bucketed = to_cpu(export_hf_weights_bucketed(chunks, hf_config, bucket_size_bytes=bucket_bytes))
    # A ring smaller than most tensors: row chunks into lent destinations / own buffers.
    dest = {n: torch.full_like(t, float("nan"), device=device) for n, t in per_tensor.items()}
    small = bucket_bytes // 8
    bucketed_dest = to_cpu(export_hf_weights_bucketed(chunks, hf_config, bucket_size_bytes=small, destinations=dest))
    bucketed_small = to_cpu(export_hf_weights_bucketed(chunks, hf_config, bucket_size_bytes=small))
    meta = [(n, tuple(t.shape), t.dtype) for n, t in per_tensor.items()]
    plan = build_plan(
        meta, layout=layout, rollout_tp=1,
        bucket_size_bytes=bucket_bytes,
    )
    in_process = to_cpu(stream_in_process(export_hf_weights(chunks, hf_config), plan, integrity_check=True))
    full_on_rank0 = export_hf_weights(chunks, hf_config)
    if dist.get_rank() == 0:
        source = list((n, t.clone()) for n, t in full_on_rank0)
    else:
        list(full_on_rank0)  # collective: every TP rank iterates
        source = None
    broadcast = to_cpu(
        stream_broadcast(source, plan, src=0, device=device, integrity_check=True)
    )
    return {"per_tensor": per_tensor, "bucketed": bucketed, "bucketed_dest": bucketed_dest,
            "bucketed_small": bucketed_small, "in_process": in_process, "broadcast": broadcast}


def direct_sync_into_vllm(hf_dir: str, actor_tp: int, rollout_tp: int) -> dict:
    """ActorRolloutRefWorker on CUDA (bf16 actor at TP=``actor_tp``, vLLM at TP=``rollout_tp``).
    Sync 1 (direct) of the unchanged checkpoint: vLLM's parameters vs the checkpoint fused and
    sharded by hand. Then the actor is perturbed; sync 2 (direct) and sync 3 (vLLM's
    reload_weights, the generic path) of the same weights must leave the same bits."""
    from safetensors.torch import load_file

    from helpers.tiny_hf import actor_rollout_ref_config as sync_config
    from helpers.tiny_hf import perturb_

    from megarl.protocol import DataProto
    from megarl.workers.hybrid import ActorRolloutRefWorker

    cfg = sync_config(hf_dir, 8, 6, **{"actor.megatron.tensor_model_parallel_size": actor_tp,
                                       "rollout.tensor_model_parallel_size": rollout_tp,
                                       "rollout.gpu_memory_utilization": 0.2,
                                       "actor.megatron.override_transformer_config.attention_backend": "auto",
                                       "rollout.weight_sync.bucket_size_mb": 0.05,
                                       # the run's dtype (the CPU suite's config is float32)
                                       "actor.megatron.dtype": "bfloat16", "rollout.dtype": "bfloat16"})
    worker = ActorRolloutRefWorker(cfg, role="actor_rollout", device="cuda")
    worker.init_model()
    sync = worker.weight_sync
    ids = torch.tensor([[0, 0, 0, 5, 6, 7, 8, 9]])
    mask = (ids > 0).long()
    prompts = DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)},
                                  {"uid": ["0"]})

    def vllm_params():
        # generate_sequences ends with vLLM asleep at level 2 (weights discarded): the sync the next
        # generation would start with loads them again, by the path in use
        worker.sync_weights()
        return {n: p.detach().cpu().clone() for n, p in worker.rollout.model().named_parameters()}

    direct = sync.direct is not None
    local = direct and sync.direct.local
    metrics = worker.sync_weights()
    loaded = vllm_params()
    checkpoint = {}
    for f in sorted(os.listdir(hf_dir)):
        if f.endswith(".safetensors"):
            checkpoint.update(load_file(os.path.join(hf_dir, f)))
    perturb_(worker.actor.engine.unwrapped_chunks(), 1.02, -0.002)
    sync.mark_changed()
    greedy_direct = worker.generate_sequences(prompts, validate=False, do_sample=False).batch["responses"]
    after_direct = vllm_params()
    sync.direct = None
    sync.mark_changed()
    greedy_reload = worker.generate_sequences(prompts, validate=False, do_sample=False).batch["responses"]
    after_reload = vllm_params()
    worker.shutdown()
    return {"direct": direct, "local": local, "metrics": metrics, "loaded": loaded, "checkpoint": checkpoint,
            "after_direct": after_direct, "after_reload": after_reload,
            "tp_rank": torch.distributed.get_rank() % rollout_tp,
            "greedy": (greedy_direct.tolist(), greedy_reload.tolist())}
