"""The trainer's worker in trainer.v1 separate_async: the actor (+ reference) with no engine beside it;
after each update its weights go to the standalone engines (megarl.workers.engine_worker).

The push: every rank exports the actor's weights as full HF tensors in bounded buckets (the same
collective export as the colocated sync, ``rollout.weight_sync.bucket_size_mb``); rank 0 broadcasts
each packed bucket, with its checksum, over the weight-push group (megarl.weight_sync.sync_group:
gloo on CPU, NCCL on GPU) while the engines load them in place. With ``param_offload`` the parameters
come onto the device for the export only; with LoRA the engines get the merged weights.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as dist

from megarl.protocol import DataProto
from megarl.utils.gpu_memory import phase_memory
from megarl.workers.hybrid import ActorRolloutRefWorker

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class SplitActorWorker(ActorRolloutRefWorker):
    """:class:`ActorRolloutRefWorker` without its engine: the same training methods, plus the push."""

    def init_model(self) -> None:
        """The Megatron models (each leaves its configured state offloaded); no engine."""
        self.actor.init_model()
        if self.ref is not None:
            self.ref.init_model()
        self.push_group = None
        self.plan = None

    def weight_push_plan(self, engine_dtype: str):
        """The resharding plan of the push (tensor order, buckets), tensors cast to ``engine_dtype``."""
        from megarl.weight_sync.plan import plan_for_model

        engine = self.actor.engine
        self.plan = plan_for_model(engine.hf_config, engine.unwrapped_chunks()[0].config, self.config.model.path,
                                   world_size=dist.get_world_size(), rollout_tp=1,
                                   bucket_size_bytes=self.bucket_size_bytes, dtype=_DTYPES[engine_dtype])
        return self.plan

    def join_weight_push(self, host: str, port: int, size: int, backend: str, timeout_s: float) -> None:
        """Rank 0 joins the weight-push group as its rank 0 (it serves the rendezvous at ``host:port``)."""
        from megarl.weight_sync.sync_group import SyncGroup

        if dist.get_rank() == 0:
            self.push_group = SyncGroup(host, port, 0, size, backend, timeout_s)

    def send_weights(self) -> dict[str, float]:
        """The push (module docstring); collective over the trainer's world and, on rank 0, the
        weight-push group. Returns ``weight_push/*`` (rank 0's broadcast)."""
        from megarl.models.lora import merged_weights
        from megarl.weight_sync.tp_gather import export_hf_weights_bucketed, release_export_buffers
        from megarl.weight_sync.transport import SyncStats, stream_broadcast

        engine = self.actor.engine
        stats = SyncStats()
        self.actor.onload_params()
        try:
            with merged_weights(engine.chunks) if self.actor.uses_lora else nullcontext():
                export = export_hf_weights_bucketed(engine.chunks, engine.hf_config, bucket_size_bytes=self.bucket_size_bytes)
                if self.push_group is not None:
                    device = "cuda" if self.push_group.backend == "nccl" else "cpu"
                    export = stream_broadcast(export, self.plan, src=0, group=self.push_group, device=device,
                                              integrity_check=self.integrity_check, stats=stats)
                for _ in export:  # every rank takes part in the export's collectives
                    pass
        finally:
            self.actor.offload_params()
            release_export_buffers()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        return stats.as_metrics("weight_push/") if self.push_group is not None else {}

    def update_actor(self, data: DataProto) -> dict[str, float]:
        return {**self.actor.update_policy(data), **phase_memory("update_actor")}

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        return self.actor.load_checkpoint(path)

    def shutdown(self) -> None:
        if self.push_group is not None:
            self.push_group.close()
            self.push_group = None

