"""The Megatron model machinery shared by the actor, reference and critic workers.

`MegatronEngine` owns one model (its chunks on this rank), and, when trainable, the DDP
wrappers, the optimizer and the lr scheduler. It knows tensors and parallel layouts, not
PPO: the workers give it per-micro-batch loss functions.

Data contract: every rank of a data-parallel group (its TP/PP/CP ranks) receives the same
rows (its DP slice). Results are computed on the last pipeline stage (identical on all TP ranks) and
broadcast to every pipeline stage, so every rank returns the same values.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.distributed import finalize_model_grads
from megatron.core.transformer.module import Float16Module
from megatron.core.utils import get_model_config

from megarl.config.schema.actor import ActorConfig
from megarl.config.schema.critic import CriticConfig
from megarl.config.schema.megatron import MegatronInferConfig, OptimConfig
from megarl.models import build_model, export_hf_weights, load_hf_weights, unwrap_chunk
from megarl.models.lora import LoraSpec, apply_lora, merged_weights
from megarl.compat.transformer_engine import fuse_te_wgrad_accumulation
from megarl.parallel import init_distributed
from megarl.parallel.dynamic_batch import fixed_size_partitions, partition_by_token_budget, restore_order
from megarl.workers.megatron.inputs import build_inputs, valid_length
from megarl.models.moe_config import moe_layers, num_experts
from megarl.models.data_parallel import is_fsdp, unsharded_params, wrap_data_parallel
from megarl.workers.megatron.optim import build_optimizer, build_scheduler, grad_reduce_in_fp32
from megarl.workers.megatron.moe_health import MoEHealth
from megarl.workers.megatron.router_replay import REPLAY, RoutingReplay, check_routes
from megarl.workers.megatron.schedule import ForwardHooks, MicroBatch, broadcast_from_last_stage, run_schedule

__all__ = ["MegatronEngine", "MicroBatchSpec", "default_device"]

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_MODEL_TENSOR_KEYS = ("input_ids", "attention_mask", "position_ids")


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


class MicroBatchSpec:
    """How to cut rows into micro-batches: fixed count or token budget (`use_dynamic_bsz`).

    `micro_batch_key` / `max_token_len_key`: the dotted config keys of the two sizes, named
    in error messages (e.g. "critic.ppo_micro_batch_size_per_gpu").
    """

    def __init__(
        self, micro_batch_size: int | None, use_dynamic_bsz: bool, max_token_len: int | None,
        *, micro_batch_key: str, max_token_len_key: str,
    ) -> None:
        self.micro_batch_size = micro_batch_size
        self.use_dynamic_bsz = bool(use_dynamic_bsz)
        self.max_token_len = max_token_len
        self.micro_batch_key = micro_batch_key
        self.max_token_len_key = max_token_len_key

    @classmethod
    def for_ppo(cls, node: ActorConfig | CriticConfig, path: str) -> "MicroBatchSpec":
        """The training micro-batches of a PPO role node (`actor_rollout_ref.actor`, `critic`):
        ppo_micro_batch_size_per_gpu, use_dynamic_bsz, ppo_max_token_len_per_gpu."""
        return cls(
            node.ppo_micro_batch_size_per_gpu, node.use_dynamic_bsz, node.ppo_max_token_len_per_gpu,
            micro_batch_key=f"{path}.ppo_micro_batch_size_per_gpu",
            max_token_len_key=f"{path}.ppo_max_token_len_per_gpu",
        )

    def partitions(self, attention_mask: torch.Tensor, min_num: int = 1, cp_size: int = 1) -> list[list[int]]:
        """Row indices per micro-batch. `cp_size`: context-parallel size; a micro-batch's token
        budget is `max_token_len * cp_size` (per GPU: each CP rank computes 1/cp of the tokens), as verl."""
        if self.use_dynamic_bsz:
            if self.max_token_len is None:
                raise ValueError(f"{self.max_token_len_key} is required with use_dynamic_bsz")
            return partition_by_token_budget(
                attention_mask.sum(-1).tolist(), int(self.max_token_len) * cp_size,
                min_num_micro_batches=min_num, key=self.max_token_len_key,
            )
        return fixed_size_partitions(attention_mask.shape[0], self.micro_batch_size, self.micro_batch_key)


class MegatronEngine:
    """One Megatron model on this rank (see module docstring).

    Args:
        megatron_cfg: verl `megatron` node (parallel sizes, seed, dtype, sequence_parallel,
            use_dist_checkpointing, dist_checkpointing_path, override_transformer_config; trained
            models also use_distributed_optimizer). Read by attribute.
        model_path: HF model directory (config.json + safetensors).
        override_config: HF config fields to override (`model.override_config`).
        value_head: critic model (`[b, s, 1]` outputs).
        optim_cfg: verl `optim` node; None = inference only (reference model).
        remove_padding: `model.use_remove_padding` (thd packing).
        prefix: dotted config path of this role, for messages (e.g. "critic").
        nccl_timeout_s: process-group timeout in seconds (the role's `nccl_timeout`); None: torch's default.
        lora: LoRA adapters on the loaded model (only they train; megarl.models.lora); None = full model.
        routing_replay: build the MoE routers to replay or record routes (megarl.workers.megatron.router_replay:
            `router_replay` once `init_model` ran; passes choose with their `routing` argument).
    """

    def __init__(
        self,
        megatron_cfg: MegatronInferConfig,
        model_path: str,
        *,
        override_config: Mapping[str, Any] | None = None,
        value_head: bool = False,
        optim_cfg: OptimConfig | None = None,
        remove_padding: bool = False,
        trust_remote_code: bool = False,
        prefix: str,
        device: str | None = None,
        nccl_timeout_s: int | None = None,
        lora: LoraSpec | None = None,
        routing_replay: bool = False,
    ) -> None:
        self.nccl_timeout_s = nccl_timeout_s
        self.megatron_cfg = megatron_cfg
        self.lora = lora
        self.routing_replay = routing_replay
        self.router_replay: RoutingReplay | None = None
        self.moe_health: MoEHealth | None = None  # an MoE model's ``moe/*`` metrics (megarl.workers.megatron.moe_health)
        self.model_path = model_path
        self.override_config = dict(override_config or {})
        self.value_head = value_head
        self.optim_cfg = optim_cfg
        self.remove_padding = bool(remove_padding)
        self.trust_remote_code = trust_remote_code
        self.prefix = prefix
        self.device = device or default_device()
        self.chunks: list[torch.nn.Module] = []
        self.optimizer = None
        self.optimizer_stepped = False  # Adam allocates its state at its first step
        self.use_distributed_optimizer = False  # trainable engines: megatron.use_distributed_optimizer (checkpoint format)
        self.scheduler = None
        self.hf_config = None
        self.transformer_impl: str | None = None  # layer spec built: "transformer_engine" | "local"

    # ------------------------------------------------------------------ setup
    @property
    def dtype(self) -> torch.dtype:
        name = self.megatron_cfg.dtype
        if name == "auto":
            return torch.float32 if self.device == "cpu" else torch.bfloat16
        if name not in _DTYPES:
            raise ValueError(f"{self.prefix}.megatron.dtype={name!r}; choose auto or one of {sorted(_DTYPES)}")
        return _DTYPES[name]

    @property
    def trainable(self) -> bool:
        return self.optim_cfg is not None

    def init_model(self) -> None:
        import transformers

        init_distributed(self.megatron_cfg, self.device, seed=self.megatron_cfg.seed, timeout_s=self.nccl_timeout_s)
        if not os.path.isdir(self.model_path):
            raise FileNotFoundError(f"{self.prefix} model path {self.model_path!r} is not a directory")
        hf_config = transformers.AutoConfig.from_pretrained(self.model_path, trust_remote_code=self.trust_remote_code)
        for key, value in self.override_config.items():
            setattr(hf_config, key, value)
        self.hf_config = hf_config
        # Activation recompute is override_transformer_config.recompute_* (verl's Megatron backend).
        overrides = dict(self.megatron_cfg.override_transformer_config)
        if self.routing_replay:
            overrides["moe_enable_routing_replay"] = True
        if self.lora is not None:  # each expert an MLP of its own, whose linears LoRA adapts (megarl.models.lora)
            overrides["moe_grouped_gemm"] = False
        # build_model reads these two (parallel sizes come from parallel_state)
        build_cfg = {"sequence_parallel": self.megatron_cfg.sequence_parallel, "override_transformer_config": overrides}
        chunks = build_model(hf_config, build_cfg, value_head=self.value_head, device=self.device, dtype=self.dtype)
        meta = unwrap_chunk(chunks[0]).megarl_meta
        self.transformer_impl = meta["transformer_impl"]
        if dist.get_rank() == 0:
            fused = [name for name, on in (("RoPE", chunks[0].config.apply_rope_fusion),
                                           ("weight-gradient accumulation", meta["wgrad_fusion"] and self.trainable))
                     if on]
            print(f"[megarl] {self.prefix}: layer spec {self.transformer_impl} on {self.device}"
                  f"{' (fused: ' + ', '.join(fused) + ')' if fused else ''}", flush=True)
        if self.megatron_cfg.use_dist_checkpointing:
            from megarl.workers.megatron.checkpoint import load_model_only

            path = self.megatron_cfg.dist_checkpointing_path
            if not path:
                raise ValueError(f"{self.prefix}.megatron.use_dist_checkpointing needs dist_checkpointing_path")
            load_model_only(chunks, path)
        else:
            load_hf_weights(chunks, self.model_path)
        if self.lora is not None:
            adapted = [name for chunk in chunks for name in apply_lora(chunk, self.lora)]
            if dist.get_rank() == 0:
                print(f"[megarl] {self.prefix}: LoRA rank {self.lora.rank} on {len(adapted)} linears "
                      "(base weights frozen)", flush=True)
        config = get_model_config(chunks[0])
        if self.dtype != torch.float32:
            chunks = [Float16Module(config, chunk) for chunk in chunks]
        if self.trainable:
            self.use_distributed_optimizer = bool(self.megatron_cfg.use_distributed_optimizer)
            chunks = wrap_data_parallel(chunks, config, self.megatron_cfg, grad_reduce_in_fp32(self.optim_cfg),
                                        self.device)
            if meta["wgrad_fusion"] and not config.gradient_accumulation_fusion and not is_fsdp(chunks):
                for chunk in chunks:  # TE accumulates into DDP's main_grad (megarl.compat.transformer_engine)
                    fuse_te_wgrad_accumulation(chunk)
            self.optimizer = build_optimizer(
                chunks, self.optim_cfg, use_distributed_optimizer=self.use_distributed_optimizer, dtype=self.dtype,
                device=self.device, prefix=f"{self.prefix}.optim",
            )
            self.scheduler = build_scheduler(self.optimizer, self.optim_cfg, prefix=f"{self.prefix}.optim")
            config.grad_scale_func = self.optimizer.scale_loss
            config.finalize_model_grads_func = finalize_model_grads
        self.chunks = chunks
        if self.routing_replay:
            self.router_replay = RoutingReplay(chunks, moe_layers(hf_config), sequence_parallel=config.sequence_parallel)
        if config.num_moe_experts:
            self.moe_health = MoEHealth(chunks, moe_layers(hf_config), num_experts(hf_config),
                                        int(hf_config.num_experts_per_tok), sequence_parallel=config.sequence_parallel)

    # ------------------------------------------------------------------ batches
    def micro_batches(
        self, data, spec: MicroBatchSpec, tensor_keys: Sequence[str], routes: bool = False,
    ) -> tuple[list[MicroBatch], list[list[int]]]:
        """Cut a DataProto's rows into model-ready micro-batches (and their row indices); `routes`: lay out
        the batch's `routed_experts` `[B, S, MoE layers, top-k]` with the tokens (routing replay)."""
        batch = data.batch
        missing = [k for k in (*_MODEL_TENSOR_KEYS, *tensor_keys, *(("routed_experts",) if routes else ()))
                   if k not in batch.keys()]
        if missing:
            raise KeyError(f"{self.prefix}: the batch lacks tensor keys {missing}")
        attention_mask = batch["attention_mask"]
        min_num = parallel_state.get_pipeline_model_parallel_world_size() if len(self.chunks) > 1 else 1
        cp = parallel_state.get_context_parallel_world_size()
        parts = spec.partitions(attention_mask, min_num=min_num, cp_size=cp)
        if len(self.chunks) > 1 and len(parts) < min_num:
            raise ValueError(
                f"{self.prefix}: the interleaved pipeline schedule (virtual_pipeline_model_parallel_size) needs at "
                f"least pipeline_model_parallel_size={min_num} micro-batches per step, got {len(parts)}"
            )
        tp = parallel_state.get_tensor_model_parallel_world_size()
        sequence_parallel = bool(self.megatron_cfg.sequence_parallel) and tp > 1
        # Sequence parallelism splits the sequence over the TP ranks; TE's FP8 GEMMs need a token
        # count divisible by 16 (padded: the row length, packed: the total). Context parallelism
        # cuts it into 2 x cp chunks and gives each CP rank 1/cp of it, which must obey the same.
        fp8 = bool(self.unwrapped_chunks()[0].config.fp8)
        pad_multiple = math.lcm(tp if sequence_parallel else 1, 16 if fp8 else 1)
        cp_group = None
        if cp > 1:
            pad_multiple = cp * math.lcm(2, pad_multiple)
            cp_group = parallel_state.get_context_parallel_group()
        # The interleaved schedule trains on micro-batches of one shape: one row length here (the CP
        # split depends on it), run_schedule pads the row / packed token counts (uniform_shapes).
        length = valid_length(attention_mask, pad_multiple) if len(self.chunks) > 1 else None
        micro = []
        for rows in parts:
            index = torch.tensor(rows, dtype=torch.long)
            row_routes = None
            if routes:
                row_routes = batch["routed_experts"][index].to(self.device)
                check_routes(row_routes, num_experts(self.hf_config), rows, f"{self.prefix}: routed_experts")
            inputs = build_inputs(
                batch["input_ids"][index].to(self.device),
                attention_mask[index].to(self.device),
                batch["position_ids"][index].to(self.device),
                remove_padding=self.remove_padding,
                pad_multiple=pad_multiple,
                length=length,
                cp_group=cp_group,
                routes=row_routes,
            )
            tensors = {k: batch[k][index].to(self.device) for k in tensor_keys}
            micro.append(MicroBatch(inputs, tensors, rows))
        return micro, parts

    def forward(
        self, data, spec: MicroBatchSpec, tensor_keys: Sequence[str],
        per_micro_batch: Callable[[torch.Tensor, MicroBatch], dict[str, torch.Tensor]],
        fp32_output: bool = True,
        routing: str | None = None,
    ) -> dict[str, torch.Tensor]:
        """Forward-only pass; `per_micro_batch(output, mb)` -> `{key: [b, ...]}`.

        `routing`: None (routers choose), REPLAY (the batch's `routed_experts`) or RECORD
        (megarl.workers.megatron.router_replay), inside a pass the caller opened on `router_replay`.

        Returns `{key: [B, ...]}` in the rows' original order, on every rank.
        """
        for chunk in self.chunks:
            chunk.eval()
        micro, parts = self.micro_batches(data, spec, tensor_keys, routes=routing == REPLAY)

        def loss_fn(output, mb):
            outputs = {k: v.detach() for k, v in per_micro_batch(output, mb).items()}
            return output.new_zeros(()), outputs

        with torch.no_grad():
            stats = run_schedule(self.chunks, micro, loss_fn, forward_only=True, fp32_output=fp32_output,
                                 hooks=self._routing_hooks(routing, forward_only=True))
        if routing is not None:
            self.router_replay.end_schedule(self.chunks)
        result = None
        if parallel_state.is_pipeline_last_stage():
            result = {k: restore_order([s[k] for s in stats], parts).cpu() for k in stats[0]} if stats else {}
        return broadcast_from_last_stage(result)

    def train_step(
        self,
        micro: Sequence[MicroBatch],
        loss_fn: Callable[[torch.Tensor, MicroBatch], tuple[torch.Tensor, dict]],
        fp32_output: bool = True,
        routing: str | None = None,
    ) -> tuple[list[dict], float, float]:
        """One optimizer step over `micro` (one mini-batch on this DP rank); `routing` as in :meth:`forward`
        (REPLAY needs micro-batches cut with `routes=True`).

        `loss_fn` returns this micro-batch's share of the mini-batch loss (global
        denominator over all micro-batches and DP ranks); megatron's averaging over
        micro-batches and DP ranks is undone here, so gradients are those of the summed loss.
        Under context parallelism every CP rank computes the same loss (per-token outputs are
        gathered over CP, megarl.workers.megatron.inputs) and back-propagates its own tokens'
        part; megatron's schedule multiplies each loss by the CP size and its DDP averages over
        DP x CP, which leaves the DP average to undo.

        Returns (stats per micro-batch on the last stage else [], grad_norm, lr used).
        The lr schedule is not advanced here: call `step_scheduler` once per training step.
        """
        for chunk in self.chunks:
            chunk.train()
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        dp_size = parallel_state.get_data_parallel_world_size()
        stats = run_schedule(
            self.chunks, micro, loss_fn, forward_only=False, loss_scale=float(dp_size), fp32_output=fp32_output,
            hooks=self._routing_hooks(routing, forward_only=False),
        )
        if routing is not None:
            self.router_replay.end_schedule(self.chunks)
        lr = self.optimizer.param_groups[0]["lr"]
        if not self.optimizer_stepped and torch.cuda.is_available():
            # The state Adam allocates now lives as long as the run: in segments of its own, not in the holes of
            # the micro-batches' freed activations, where it would keep their segments from ever going back
            # to the driver (vLLM's KV cache wakes up into what torch gave back)
            torch.cuda.empty_cache()
        success, grad_norm, _ = self.optimizer.step()
        self.optimizer_stepped = True
        if not success:
            logger.warning("%s: optimizer step skipped (non-finite gradients: fp16 loss-scale overflow or NaN/Inf)", self.prefix)
        return stats, float(grad_norm) if grad_norm is not None else float("nan"), float(lr)

    def _routing_hooks(self, routing: str | None, forward_only: bool) -> tuple[ForwardHooks, ...]:
        """What watches each chunk forward: the MoE health counters (count only inside their pass) and the
        routing replay of this pass."""
        health = (self.moe_health,) if self.moe_health is not None else ()
        if routing is None:
            return health
        if self.router_replay is None or self.router_replay.mode != routing:
            raise RuntimeError(f"{self.prefix}: routing={routing!r} outside a {routing} pass of its router_replay "
                               "(build the engine with routing_replay=True and call router_replay.begin first)")
        config = self.unwrapped_chunks()[0].config
        # backward re-runs the routers only under activation recompute: only then is a forward's routes' FIFO read
        self.router_replay.backward_replay = not forward_only and config.recompute_granularity is not None
        return (*health, self.router_replay)

    def step_scheduler(self) -> None:
        """Advance the lr schedule by one training step (verl: one per update call, so
        `optim.total_training_steps` / warmup steps count trainer steps, not mini-batches)."""
        self.scheduler.step(increment=1)

    # ------------------------------------------------------------------ weights
    def export_hf_weights(self):
        """Full HF tensors, collective over the model-parallel group (see megarl.models); with
        LoRA the merged weights W + alpha/r * B @ A."""
        with merged_weights(self.chunks), unsharded_params(self.chunks):
            yield from export_hf_weights(self.chunks, self.hf_config)

    def unwrapped_chunks(self) -> list[torch.nn.Module]:
        return [unwrap_chunk(c) for c in self.chunks]


def dp_all_reduce(values: dict[str, float], sum_keys: Sequence[str] = ()) -> dict[str, float]:
    """Combine per-rank metrics over the data-parallel group: sums for `sum_keys`, means else."""
    keys = sorted(values)
    dp_size = parallel_state.get_data_parallel_world_size()
    if dp_size == 1 or not keys:
        return dict(values)
    tensor = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    if dist.get_backend(parallel_state.get_data_parallel_group()) == "nccl":
        tensor = tensor.cuda()
    dist.all_reduce(tensor, group=parallel_state.get_data_parallel_group())
    return {k: (v if k in sum_keys else v / dp_size) for k, v in zip(keys, tensor.cpu().tolist())}
