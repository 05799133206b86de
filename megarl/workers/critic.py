"""Megatron critic worker: a value model (LM backbone + linear value head).

One `CriticWorker` per rank (SPMD), same data contract as the actor (DP slices in, every
rank returns the same results). Config: the typed `critic` section (`CriticConfig`, verl names):
model.{path, override_config, use_remove_padding,
trust_remote_code}, megatron.*, optim.*, ppo_mini_batch_size (prompts; x rollout_n responses),
rollout_n (= actor_rollout_ref.rollout.n), ppo_micro_batch_size_per_gpu (training and value
forward), use_dynamic_bsz, ppo_max_token_len_per_gpu (training) / forward_max_token_len_per_gpu
(value forward), ppo_epochs, shuffle, data_loader_seed, cliprange_value, loss_agg_mode,
loss_scale_factor, checkpoint.*.
"""

from __future__ import annotations

import torch

from megarl.algorithms.value import compute_value_loss
from megarl.config.schema.critic import CriticConfig
from megarl.models.weights import has_hf_value_head
from megarl.protocol import DataProto
from megarl.workers.megatron.engine import MicroBatchSpec
from megarl.workers.megatron.inputs import response_mask_of, to_response
from megarl.workers.megatron.offload import PARAMS
from megarl.workers.megatron.ppo_loop import run_ppo_update, update_inputs
from megarl.workers.megatron.worker_base import MegatronWorker

__all__ = ["CriticWorker"]


_SHARE_KEYS = ("critic/vf_loss",)


class CriticWorker(MegatronWorker):
    """Value model on Megatron-Core.

    Values are aligned the verl way: `values[:, t]` is the value of the state before
    response token t (the hidden state at the position that predicts it).

    Args:
        config: the `critic` node.
        device: "cpu" | "cuda"; default cuda when available.
    """

    def __init__(self, config: CriticConfig, device: str | None = None) -> None:
        self.config = config
        super().__init__(
            config.model, config.megatron, config.optim, config.checkpoint,
            value_head=True, prefix="critic", device=device, nccl_timeout_s=config.nccl_timeout,
        )
        self.train_spec = MicroBatchSpec.for_ppo(config, "critic")
        # as verl: the value forward uses the training micro-batch size, its own token budget
        self.forward_spec = MicroBatchSpec(
            config.ppo_micro_batch_size_per_gpu, config.use_dynamic_bsz, config.forward_max_token_len_per_gpu,
            micro_batch_key="critic.ppo_micro_batch_size_per_gpu",
            max_token_len_key="critic.forward_max_token_len_per_gpu",
        )

    def init_model(self) -> None:
        """Process groups, backbone from critic.model.path + deterministic value head, optimizer."""
        super().init_model()
        if not has_hf_value_head(self.engine.model_path):
            self._init_value_head(int(self.config.megatron.seed))

    def _init_value_head(self, seed: int) -> None:
        """N(0, init_method_std) from a generator seeded by `critic.megatron.seed`.

        Independent of the parallel layout (the head is replicated over TP and lives on the
        last pipeline stage), so TP=1 and TP=2 critics start from the same head.
        """
        head = self.value_head_weight()
        if head is None:
            return
        std = self.engine.unwrapped_chunks()[-1].config.init_method_std
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            head.copy_(torch.randn(head.shape, generator=gen, dtype=torch.float32).mul_(std).to(head))

    def value_head_weight(self) -> torch.Tensor | None:
        """The value head weight `[1, hidden]` on the last pipeline stage, else None."""
        last = self.engine.unwrapped_chunks()[-1]
        layer = getattr(last, "output_layer", None)
        return None if layer is None else layer.weight

    def compute_values(self, data: DataProto) -> DataProto:
        """`values` `[B, R]` (0 at padded response positions) for input_ids/attention_mask/position_ids."""
        response_length = data.batch["responses"].shape[1]

        def per_micro_batch(output, mb):
            return {"values": to_response(output[..., 0].float(), mb.inputs, response_length)}

        with self._onloaded((PARAMS,)):  # a forward needs neither gradients nor optimizer state
            result = self.engine.forward(data, self.forward_spec, (), per_micro_batch)
        mask = response_mask_of(data).to(result["values"].dtype)
        return DataProto.from_dict({"values": result["values"] * mask})

    def update_critic(self, data: DataProto) -> dict[str, float]:
        """Clipped value loss (megarl.algorithms.value) over ppo_epochs x mini x micro batches.

        Input batch: input_ids/attention_mask/position_ids, responses, response_mask,
        values (old predictions), returns. Returns critic/vf_loss, vf_clipfrac, vpred_mean,
        grad_norm, lr (averaged over mini-batches). NaN/Inf handling as ActorWorker.update_policy
        (phase update_critic; critic/nonfinite_skipped_steps under nan_policy=skip).
        """
        cfg = self.config
        response_length = data.batch["responses"].shape[1]
        loss_agg_mode = cfg.loss_agg_mode
        cliprange_value = float(cfg.cliprange_value)
        loss_scale_factor = cfg.loss_scale_factor
        tensors = update_inputs(data, ("values", "returns"), method="update_critic")

        def make_loss_fn(denominator):
            def loss_fn(output, mb):
                t = mb.tensors
                vpreds = to_response(output[..., 0].float(), mb.inputs, response_length)
                loss, clipfrac = compute_value_loss(
                    vpreds, t["returns"], t["values"], t["response_mask"], cliprange_value,
                    loss_agg_mode, denominator, loss_scale_factor,
                )
                mask = t["response_mask"].bool()
                vpred_mean = vpreds.detach()[mask].mean().item() if mask.any() else 0.0
                return loss, {"critic/vf_loss": loss.item(), "critic/vf_clipfrac": clipfrac,
                              "critic/vpred_mean": vpred_mean}

            return loss_fn

        with self._onloaded():
            return run_ppo_update(
                self.engine, data, tensors, make_loss_fn, self.train_spec,
                mini_batch_size=cfg.ppo_mini_batch_size, rollout_n=cfg.rollout_n,
                ppo_epochs=cfg.ppo_epochs, shuffle=cfg.shuffle, seed=cfg.data_loader_seed,
                prefix="critic", phase="update_critic", metric_prefix="critic", share_keys=_SHARE_KEYS,
            )
