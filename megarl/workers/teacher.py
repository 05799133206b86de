"""Megatron distillation teacher: a frozen causal LM scoring the student's rollouts, forward only.

One `TeacherWorker` per rank (SPMD), the data contract of the other Megatron workers (DP slices in,
every rank returns the same results). verl serves the teacher with vLLM (prompt log-probs); megarl
runs it as a Megatron-Core model whose layout comes from verl's `inference.*` keys
(`forward_only_megatron`): tensor parallel, data parallel over the rest of its pool.

Config: `distillation` (verl's names, typed: megarl.config.schema.distillation).
"""

from __future__ import annotations

from megarl.config.schema.distillation import DistillationConfig
from megarl.protocol import DataProto
from megarl.workers.megatron.engine import MicroBatchSpec
from megarl.workers.megatron.inputs import next_token_labels, response_mask_of, to_response
from megarl.workers.megatron.offload import PARAMS
from megarl.workers.megatron.vocab_parallel import vocab_parallel_log_probs
from megarl.workers.megatron.vocab_topk import vocab_parallel_topk_log_probs
from megarl.workers.megatron.worker_base import MegatronWorker, forward_only_megatron, forward_only_model

__all__ = ["TeacherWorker"]

PREFIX = "distillation.teacher_models.teacher_model"


class TeacherWorker(MegatronWorker):
    """The teacher on Megatron-Core.

    Args:
        config: the `distillation` section (typed).
        device: "cpu" | "cuda"; default cuda when available.
    """

    def __init__(self, config: DistillationConfig, device: str | None = None) -> None:
        self.config = config
        teacher = config.teacher_models.teacher_model
        inference = teacher.inference
        super().__init__(
            forward_only_model(teacher.model_path),
            forward_only_megatron(inference.tensor_model_parallel_size, 1, inference.dtype, inference.free_cache_engine),
            None, None, value_head=False, prefix=PREFIX, device=device,
            nccl_timeout_s=None,  # verl's teacher has no such key: torch.distributed's default
        )
        self.spec = MicroBatchSpec(
            inference.max_num_seqs, False, None,
            micro_batch_key=f"{PREFIX}.inference.max_num_seqs", max_token_len_key=f"{PREFIX}.inference.max_model_len",
        )

    def compute_teacher_log_prob(self, data: DataProto) -> DataProto:
        """The teacher's log-probs on the student's responses, of softmax(logits / inference.temperature).

        Input batch: input_ids/attention_mask/position_ids `[B, P+R]`, responses `[B, R]`.
        Returns `teacher_logprobs` `[B, R]` (the sampled token's; estimator loss modes), or with
        forward_kl_topk `teacher_logprobs` `[B, R, topk]` fp32 and `teacher_ids` `[B, R, topk]` int64
        (the teacher's top-k, vocab-parallel over its TP ranks); zero at padded response positions.
        """
        temperature = self.config.teacher_models.teacher_model.inference.temperature
        response_length = data.batch["responses"].shape[1]
        topk = self.config.distillation_loss.topk if self.config.uses_topk() else None

        def per_micro_batch(logits, mb):
            if topk is None:
                logp = vocab_parallel_log_probs(logits, next_token_labels(mb.inputs), temperature=temperature)
                return {"teacher_logprobs": to_response(logp, mb.inputs, response_length)}
            values, ids = vocab_parallel_topk_log_probs(logits, topk, temperature=temperature)
            return {"teacher_logprobs": to_response(values, mb.inputs, response_length),
                    "teacher_ids": to_response(ids, mb.inputs, response_length)}

        with self._onloaded((PARAMS,)):
            result = self.engine.forward(data, self.spec, (), per_micro_batch, fp32_output=False)
        mask = response_mask_of(data)
        out = {"teacher_logprobs": result["teacher_logprobs"] * (mask if topk is None else mask.unsqueeze(-1))}
        if topk is not None:
            out["teacher_ids"] = result["teacher_ids"] * mask.unsqueeze(-1).to(result["teacher_ids"].dtype)
        return DataProto.from_dict(out)
