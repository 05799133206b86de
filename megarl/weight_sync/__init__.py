"""Weight sync: Megatron shards -> HF tensors -> vLLM engines, bucketed and checked.

See :mod:`megarl.weight_sync.plan` (what goes where), :mod:`.transport` (how it
moves), :mod:`.integrity` (per-bucket checksums), :mod:`.metrics` (rollout vs actor
log-prob gap).
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
