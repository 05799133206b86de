"""Megatron reward-model worker: a forward-only sequence classifier (LM backbone + score head).

One `RewardModelWorker` per rank (SPMD), the data contract of the other Megatron workers (DP
slices in, every rank returns the same results). The model is an HF `*ForSequenceClassification`
checkpoint with one label (`score.weight` `[1, hidden]`), built as the critic's GPTModel with its
value head (megarl.models.value_head) holding `score.weight`; the score of a sequence is the head's
output at its last token, as HF's forward and verl's vLLM `/classify` read it.

Config: `reward.reward_model` (verl's names, typed: megarl.config.schema.reward). verl serves the
reward model with vLLM; its `rollout.*` keys map onto the Megatron forward as
`reward_model_megatron` says.
"""

from __future__ import annotations

from megarl.config.schema.megatron import MegatronInferConfig
from megarl.config.schema.reward import RewardModelConfig, RewardModelRolloutConfig
from megarl.models.weights import has_hf_value_head
from megarl.protocol import DataProto
from megarl.workers.megatron.engine import MicroBatchSpec
from megarl.workers.megatron.inputs import at_last_token
from megarl.workers.megatron.offload import PARAMS
from megarl.workers.megatron.worker_base import MegatronWorker, forward_only_megatron, forward_only_model

__all__ = ["RewardModelWorker", "reward_model_megatron"]

PREFIX = "reward.reward_model"


def reward_model_megatron(rollout: RewardModelRolloutConfig) -> MegatronInferConfig:
    """verl's `reward.reward_model.rollout` (vLLM server) -> the `megatron` node MegatronEngine reads
    (verl has none for the reward model): TP and PP sizes as given, parameters in `dtype`, offloaded
    between calls when `free_cache_engine` (verl sleeps its server then); data parallel over the rest
    of the world (verl's replicas)."""
    return forward_only_megatron(rollout.tensor_model_parallel_size, rollout.pipeline_model_parallel_size,
                                 rollout.dtype, rollout.free_cache_engine)


class RewardModelWorker(MegatronWorker):
    """A reward model on Megatron-Core, scoring whole sequences.

    Args:
        config: the `reward.reward_model` node (typed).
        device: "cpu" | "cuda"; default cuda when available.
    """

    def __init__(self, config: RewardModelConfig, device: str | None = None) -> None:
        self.config = config
        rollout = config.rollout
        super().__init__(
            forward_only_model(config.model_path), reward_model_megatron(rollout), None, None,
            value_head=True, prefix=PREFIX, device=device,
            nccl_timeout_s=None,  # verl's reward model has no such key: torch.distributed's default
        )
        self.spec = MicroBatchSpec(
            rollout.max_num_seqs, False, None,
            micro_batch_key=f"{PREFIX}.rollout.max_num_seqs", max_token_len_key=f"{PREFIX}.rollout.max_model_len",
        )

    def init_model(self) -> None:
        """Process groups and the model from `model_path` (its `score.weight` required); offloaded
        right away with `rollout.free_cache_engine` (onloaded for each scoring call)."""
        path = self.config.model_path
        if not has_hf_value_head(path):
            raise ValueError(f"{PREFIX}.model_path={path!r} has no score.weight: not a sequence-classification "
                             "reward model (save it with AutoModelForSequenceClassification, num_labels=1)")
        super().init_model()

    def compute_rm_score(self, data: DataProto) -> DataProto:
        """`rm_scores` `[B]` float32: the score head at each row's last valid token.

        Input batch: the reward model's own `input_ids` / `attention_mask` / `position_ids` `[B, L]`
        (megarl.reward.rm_inputs), in micro-batches of `rollout.max_num_seqs` rows.
        """

        def per_micro_batch(output, mb):
            return {"rm_scores": at_last_token(output[..., 0].float(), mb.inputs)}

        with self._onloaded((PARAMS,)):
            result = self.engine.forward(data, self.spec, (), per_micro_batch)
        return DataProto.from_dict({"rm_scores": result["rm_scores"]})
