"""Megatron critic worker: a value model (LM backbone + linear value head).

One `CriticWorker` per rank (SPMD), same data contract as the actor (DP slices in, every
rank returns the same results). Config: the `critic` subtree (verl names): model.{path,
override_config, use_remove_padding, enable_gradient_checkpointing, trust_remote_code},
megatron.*, optim.*, ppo_mini_batch_size, ppo_micro_batch_size_per_gpu, use_dynamic_bsz,
ppo_max_token_len_per_gpu, forward_micro_batch_size_per_gpu /
forward_max_token_len_per_gpu (default: the ppo_* values), ppo_epochs, shuffle,
data_loader_seed, cliprange_value, loss_agg_mode, loss_scale_factor, checkpoint.*,
rollout_n (responses per prompt; or pass `rollout_n=` to the constructor).
"""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig

from megarl.algorithms.value import compute_value_loss
from megarl.protocol import DataProto
from megarl.workers.actor import response_mask_of
from megarl.workers.megatron.checkpoint import load_checkpoint, save_checkpoint
from megarl.workers.megatron.engine import MegatronEngine, MicroBatchSpec
from megarl.workers.megatron.inputs import to_response
from megarl.workers.megatron.offload import Offloader
from megarl.workers.megatron.ppo_loop import (
    NonFiniteCheck,
    global_denominator,
    iterate_mini_batches,
    mean_metrics,
    mini_batch_rows,
    reduce_micro_stats,
)
from megarl.workers.megatron.schedule import broadcast_from_last_stage

__all__ = ["CriticWorker"]


def _has_hf_value_head(model_path: str) -> bool:
    """Whether the HF dir carries a value head (`score.weight`, e.g. a saved critic)."""
    import json
    import os

    from safetensors import safe_open

    index = os.path.join(model_path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as handle:
            return "score.weight" in json.load(handle)["weight_map"]
    for name in sorted(os.listdir(model_path)):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(model_path, name), framework="pt") as handle:
                if "score.weight" in handle.keys():
                    return True
    return False

_SHARE_KEYS = ("critic/vf_loss",)


class CriticWorker:
    """Value model on Megatron-Core.

    Values are aligned the verl way: `values[:, t]` is the value of the state before
    response token t (the hidden state at the position that predicts it).
    """

    def __init__(self, config: DictConfig, device: str | None = None, rollout_n: int | None = None) -> None:
        """`rollout_n`: responses per prompt (actor_rollout_ref.rollout.n), the unit of
        `critic.ppo_mini_batch_size`; default `critic.rollout_n` (verl's key), else 1."""
        self.config = config
        self.rollout_n = int(rollout_n if rollout_n is not None else config.get("rollout_n", 1) or 1)
        model = config.model
        self.engine = MegatronEngine(
            config.megatron,
            model.path,
            override_config=model.get("override_config", None),
            value_head=True,
            optim_cfg=config.optim,
            remove_padding=model.get("use_remove_padding", False),
            gradient_checkpointing=model.get("enable_gradient_checkpointing", False),
            trust_remote_code=model.get("trust_remote_code", False),
            prefix="critic",
            device=device,
        )
        use_dynamic = config.get("use_dynamic_bsz", False)
        self.train_spec = MicroBatchSpec(
            config.get("ppo_micro_batch_size_per_gpu", None), use_dynamic,
            config.get("ppo_max_token_len_per_gpu", None), prefix="critic.ppo_",
        )
        self.forward_spec = MicroBatchSpec(
            config.get("forward_micro_batch_size_per_gpu", None) or config.get("ppo_micro_batch_size_per_gpu", None),
            use_dynamic,
            config.get("forward_max_token_len_per_gpu", None) or config.get("ppo_max_token_len_per_gpu", None),
            prefix="critic.forward_",
        )
        self.offloader: Offloader | None = None

    def init_model(self) -> None:
        """Process groups, backbone from critic.model.path + deterministic value head, optimizer."""
        self.engine.init_model()
        if not _has_hf_value_head(self.engine.model_path):
            self._init_value_head(int(self.config.megatron.get("seed", 42)))
        megatron = self.config.megatron
        self.offloader = Offloader(
            self.engine,
            params=bool(megatron.get("param_offload", False)),
            grads=bool(megatron.get("grad_offload", False)),
            optimizer=bool(megatron.get("optimizer_offload", False)),
        )

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

        with self.offloader.onloaded():
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
        loss_agg_mode = cfg.get("loss_agg_mode", "token-mean")
        cliprange_value = float(cfg.get("cliprange_value", 0.5))
        loss_scale_factor = cfg.get("loss_scale_factor", None)
        batch = data.batch
        tensors = {"response_mask": response_mask_of(data)}
        for key in ("values", "returns"):
            if key not in batch.keys():
                raise KeyError(f"update_critic: the batch lacks {key!r}")
            tensors[key] = batch[key]
        model_tensors = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids", "responses")}
        work = DataProto.from_dict({**model_tensors, **tensors})
        rows = mini_batch_rows(cfg.ppo_mini_batch_size, self.rollout_n, len(work), "critic")
        epochs = int(cfg.get("ppo_epochs", 1))
        nan_check = NonFiniteCheck(data.meta_info, "critic", "update_critic", epochs * (len(work) // rows))
        steps = []
        with self.offloader.onloaded():
            for index in iterate_mini_batches(
                len(work), rows, epochs, cfg.get("shuffle", False), cfg.get("data_loader_seed", 0) or 0
            ):
                mini = work[index]
                denominator = global_denominator(mini.batch["response_mask"])
                micro, _ = self.engine.micro_batches(mini, self.train_spec, tuple(tensors))

                def loss_fn(output, mb, denominator=denominator):
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

                micro_stats, grad_norm, lr = self.engine.train_step(micro, loss_fn)
                step = reduce_micro_stats(micro_stats, _SHARE_KEYS)
                step.update({"critic/grad_norm": grad_norm, "critic/lr": lr})
                if not nan_check.drop(step, self.engine.optimizer):
                    steps.append(step)
        self.engine.step_scheduler()
        return broadcast_from_last_stage({**mean_metrics(steps), **nan_check.metrics("critic")})

    def save_checkpoint(self, path: str, global_step: int = 0) -> None:
        contents = self.config.get("checkpoint", {}).get("save_contents", ["model", "optimizer", "extra"])
        with self.offloader.onloaded():
            save_checkpoint(self.engine, path, contents=list(contents), global_step=global_step)

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        contents = self.config.get("checkpoint", {}).get("load_contents", ["model", "optimizer", "extra"])
        with self.offloader.onloaded():
            return load_checkpoint(self.engine, path, contents=list(contents))

    def offload(self) -> None:
        self.offloader.offload()

    def onload(self) -> None:
        self.offloader.onload()
