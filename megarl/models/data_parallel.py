"""The data-parallel wrapper of a trained Megatron model: megatron-core's DDP, or Megatron-FSDP
(`megatron.use_megatron_fsdp`, as verl 0.9.1's Megatron engine), and the full (TP-local) parameters
of an FSDP model for the readers that walk the model's tensors (HF export, weight sync).

Megatron-FSDP (`data_parallel_sharding_strategy="optim_grads_params"`, ZeRO-3) keeps each parameter,
its gradient and its optimizer state sharded over the DP (x CP) ranks: between passes a chunk's
parameters are DTensors holding this rank's 1/DP; forward and backward all-gather them one
transformer layer at a time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.distributed.fsdp.mcore_fsdp_adapter import FullyShardedDataParallel

from megarl.config.schema.megatron import MegatronTrainConfig

__all__ = ["wrap_data_parallel", "unsharded_params", "is_fsdp"]


def wrap_data_parallel(
    chunks: Sequence[torch.nn.Module], config, megatron_cfg: MegatronTrainConfig, grad_reduce_in_fp32: bool,
    device: str,
) -> list[torch.nn.Module]:
    """Each model chunk in DDP, or in Megatron-FSDP with `megatron_cfg.use_megatron_fsdp` (which the
    config rules allow only with use_distributed_optimizer). `config`: the chunks' TransformerConfig."""
    if not megatron_cfg.use_megatron_fsdp:
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=grad_reduce_in_fp32, overlap_grad_reduce=False,
            use_distributed_optimizer=bool(megatron_cfg.use_distributed_optimizer),
        )
        return [DistributedDataParallel(config=config, ddp_config=ddp_config, module=chunk, disable_bucketing=i > 0)
                for i, chunk in enumerate(chunks)]
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=grad_reduce_in_fp32, overlap_grad_reduce=False, use_distributed_optimizer=True,
        use_megatron_fsdp=True, data_parallel_sharding_strategy="optim_grads_params",
        # the fused pre-scaled reduce-scatter is NCCL's PREMUL_SUM, which gloo lacks: scale, then sum
        gradient_reduce_div_fusion=device != "cpu",
    )
    fsdp_device = torch.device("cpu") if device == "cpu" else None  # None: the current CUDA device
    return [FullyShardedDataParallel(config=config, ddp_config=ddp_config, module=chunk, disable_bucketing=i > 0,
                                     device=fsdp_device)
            for i, chunk in enumerate(chunks)]


def is_fsdp(chunks: Sequence[torch.nn.Module]) -> bool:
    return any(isinstance(chunk, FullyShardedDataParallel) for chunk in chunks)


@contextlib.contextmanager
def unsharded_params(chunks: Sequence[torch.nn.Module]) -> Iterator[None]:
    """While the block runs, an FSDP chunk's parameters are its full TP-local tensors (all-gathered
    over DP, as DDP holds them); collective over the DP group. DDP chunks are left as they are.
    The gathered buffers are released afterwards (the model's whole TP-local size while held)."""
    fsdp = [chunk.module for chunk in chunks if isinstance(chunk, FullyShardedDataParallel)]
    gathered = []
    try:
        for model in fsdp:
            model._replace_param_with_raw_if_needed()
            params = list(model.module.parameters())
            model.all_gather_and_wait_parameters_ready(params, prefetch=False)
            model._replace_param_with_raw_if_needed()  # the gather left the sharded DTensors in place
            gathered.append((model, params))
        yield
    finally:
        for model, params in gathered:
            buffer = model.param_and_grad_buffer
            for bucket_id in {buffer.param_to_param_group[p] for p in params}:
                model.all_gather_pipeline.release_bucket(bucket_id, False)
            model._replace_param_with_distributed_if_needed()
