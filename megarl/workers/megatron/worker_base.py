"""What the actor, reference and critic workers share: one MegatronEngine built from a role's
config nodes, its offloading, dist checkpoints and HF export.

Config: the role's typed sections (megarl.config.schema): `model.{path, override_config,
use_remove_padding, trust_remote_code}`, `megatron.{param_offload, grad_offload,
optimizer_offload, use_remove_padding}` (plus what
MegatronEngine reads), `checkpoint.{save_contents, load_contents}`.
"""

from __future__ import annotations

import contextlib
from typing import Any

from megarl.config.schema.actor import LoraConfig, ModelConfig
from megarl.config.schema.megatron import CheckpointConfig, MegatronInferConfig, OptimConfig
from megarl.models.lora import LoraSpec
from megarl.workers.megatron.checkpoint import load_checkpoint, save_checkpoint
from megarl.workers.megatron.engine import MegatronEngine
from megarl.workers.megatron.offload import ALL, PARAMS, Offloader

__all__ = ["MegatronWorker", "forward_only_megatron", "forward_only_model"]


def forward_only_megatron(tp: int, pp: int, dtype: str, param_offload: bool) -> MegatronInferConfig:
    """The `megatron` node of a model verl serves with vLLM (reward model, distillation teacher):
    TP and PP as given, data parallel over the rest of its world, parameters in `dtype` and offloaded
    between calls with `param_offload`; no other parallelism (a forward draws no random numbers)."""
    return MegatronInferConfig(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=None, context_parallel_size=1, expert_model_parallel_size=1,
        expert_tensor_parallel_size=None, sequence_parallel=False, use_dist_checkpointing=False,
        dist_checkpointing_path=None, param_offload=param_offload, use_remove_padding=False, seed=0, dtype=dtype,
        override_transformer_config={},
    )


def forward_only_model(model_path: str) -> ModelConfig:
    """The `model` node of such a model: padded rows (every layer spec, CPU included), no overrides,
    no custom code."""
    return ModelConfig(path=model_path, tokenizer_path=None, trust_remote_code=False, override_config={},
                       use_remove_padding=False)


class MegatronWorker:
    """One Megatron model of a role and its plumbing (see module docstring).

    Args:
        model_cfg: the role's `model` node.
        megatron_cfg: the role's `megatron` node.
        optim_cfg: the `optim` node; None = forward only (reference).
        checkpoint_cfg: the `checkpoint` node (save_checkpoint / load_checkpoint); None = never saved.
        value_head: critic model (`[b, s, 1]` outputs).
        prefix: dotted config path of the role, for messages (e.g. "critic").
        nccl_timeout_s: the process-group timeout, seconds (the role's `nccl_timeout`); None: torch's default.
        device: "cpu" | "cuda"; default cuda when available.
        lora_cfg: the typed `model.lora` node of a trained policy; None = no adapters.
        routing_replay: MoE routers that can replay or record routes (the role's `megatron.router_replay.mode`).
    """

    def __init__(
        self, model_cfg: ModelConfig, megatron_cfg: MegatronInferConfig, optim_cfg: OptimConfig | None,
        checkpoint_cfg: CheckpointConfig | None, *, value_head: bool, prefix: str, device: str | None,
        nccl_timeout_s: int | None,
        lora_cfg: LoraConfig | None = None, routing_replay: bool = False,
    ) -> None:
        # verl's Megatron engine reads megatron.use_remove_padding; false there means padded rows whatever
        # model.use_remove_padding says (both read: each changes the layout)
        model_packs, megatron_packs = model_cfg.use_remove_padding, megatron_cfg.use_remove_padding
        packs = model_packs and megatron_packs
        self.engine = MegatronEngine(
            megatron_cfg,
            model_cfg.path,
            override_config=model_cfg.override_config,
            value_head=value_head,
            optim_cfg=optim_cfg,
            remove_padding=packs,
            trust_remote_code=model_cfg.trust_remote_code,
            prefix=prefix,
            device=device,
            nccl_timeout_s=nccl_timeout_s,
            lora=None if lora_cfg is None else LoraSpec.from_config(lora_cfg, seed=megatron_cfg.seed),
            routing_replay=routing_replay,
        )
        self.megatron_cfg = megatron_cfg
        self.checkpoint_cfg = checkpoint_cfg
        self.offloader: Offloader | None = None

    def init_model(self) -> None:
        """Process groups, model chunks with HF (or dist-checkpoint) weights, optimizer; then the
        configured state goes to the host at once, so that whatever starts next on this GPU (a
        colocated vLLM engine sizing its KV cache, another role) finds the memory free."""
        self.engine.init_model()
        self.offloader = Offloader(
            self.engine,
            params=bool(self.megatron_cfg.param_offload),
            # a forward-only model has no gradients or optimizer (and its megatron node no such keys)
            grads=bool(self.megatron_cfg.param_offload) or (self.engine.trainable and bool(self.megatron_cfg.grad_offload)),
            optimizer=self.engine.trainable and bool(self.megatron_cfg.optimizer_offload),
        )
        self.offloader.offload()

    def save_checkpoint(self, path: str, global_step: int = 0) -> None:
        """Megatron dist checkpoint of `checkpoint.save_contents` (model, optimizer, lr
        scheduler + RNG, HF export; see checkpoint.py)."""
        with self._onloaded():
            save_checkpoint(self.engine, path, contents=list(self.checkpoint_cfg.save_contents), global_step=global_step)

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        """Restore `checkpoint.load_contents` of what `save_checkpoint` wrote (any TP/PP layout);
        returns its metadata."""
        with self._onloaded():
            return load_checkpoint(self.engine, path, contents=list(self.checkpoint_cfg.load_contents))

    def export_hf_weights(self):
        """Iterator of (hf_name, full tensor); collective over the model-parallel group. The
        parameters are on the device while it runs."""
        with self._onloaded((PARAMS,)):
            yield from self.engine.export_hf_weights()

    def offload(self, groups: tuple[str, ...] = ALL) -> None:
        """Move the configured state among ``groups`` (megarl.workers.megatron.offload:
        megatron.param_offload = params and grads; optimizer_offload) to host memory;
        no-op before init_model."""
        if self.offloader is not None:
            self.offloader.offload(groups)

    def onload(self, groups: tuple[str, ...] = ALL) -> None:
        """Bring offloaded state among ``groups`` back to the training device."""
        if self.offloader is not None:
            self.offloader.onload(groups)

    def onload_params(self) -> None:
        """The parameters alone back on the device (a forward, the weight sync into vLLM)."""
        self.onload((PARAMS,))

    def offload_params(self) -> None:
        """The parameters back to the host when ``megatron.param_offload``."""
        self.offload((PARAMS,))

    def _onloaded(self, groups: tuple[str, ...] = ALL):
        """Context: ``groups`` on device for the block, re-offloaded after it if they were offloaded."""
        return self.offloader.onloaded(groups) if self.offloader is not None else contextlib.nullcontext()
