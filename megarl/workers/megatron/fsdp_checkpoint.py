"""Checkpoints of a Megatron-FSDP engine (`megatron.use_megatron_fsdp`): megatron-core's `fsdp_dtensor`
format, as Megatron-LM writes it (training/checkpointing.py, `--ckpt-format fsdp_dtensor`).

`<path>/fsdp_dtensor/`: a torch.distributed.checkpoint of the FSDP chunks' state dicts (each parameter
a DTensor holding this rank's 1/DP) and the distributed optimizer's per-parameter state
(`distrib_optim_sharding_type="fsdp_dtensor"`: Adam's step, exp_avg, exp_avg_sq as DTensors of the same
sharding), after megatron-fsdp's `preprocess_state_dict_for_uneven_dtensor` (its shards are uneven);
plus `common.pt` (rank 0): megarl's metadata, the lr scheduler, and the RNG states of DP rank 0 per
(PP, TP) rank, read back with `torch.load(weights_only=True)`.

It loads only into a Megatron-FSDP model at the same TP/PP/VPP/CP/EP layout: Megatron-LM reshards
TP only through its SwiGLU / expert rewrites (`handle_swiglu_in_state_dict`), which megarl does not
apply; the caller refuses another layout (megarl.workers.megatron.checkpoint), as the trainer does
before Ray starts (megarl.trainer.resume_config.refuse_fsdp_resume).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from megatron.core import parallel_state
from megatron.core.distributed.fsdp.src.megatron_fsdp.uneven_dtensor import preprocess_state_dict_for_uneven_dtensor

from megarl.utils.safe_checkpoint import safe_torch_load

__all__ = ["FSDP_DIR", "OPTIMIZER_FORMAT", "save_fsdp", "load_fsdp", "read_common", "rng_state_of_this_rank"]

FSDP_DIR = "fsdp_dtensor"
OPTIMIZER_FORMAT = "fsdp_dtensor"
_COMMON = "common.pt"


def _model_state(chunks: Sequence[torch.nn.Module]) -> dict[str, Any]:
    """The chunks' state dicts (DTensor shards), keyed `model` / `model{i}` as megatron's checkpoints."""
    dicts = [chunk.state_dict() for chunk in chunks]
    return {"model": dicts[0]} if len(dicts) == 1 else {f"model{i}": d for i, d in enumerate(dicts)}


def _optimizer_state(engine, is_loading: bool) -> dict[str, Any]:
    return engine.optimizer.sharded_state_dict({}, is_loading=is_loading,
                                               metadata={"distrib_optim_sharding_type": OPTIMIZER_FORMAT})


def _rng_key() -> str:
    return f"({parallel_state.get_pipeline_model_parallel_rank()}, {parallel_state.get_tensor_model_parallel_rank()})"


def save_fsdp(engine, ckpt_dir: str, common: dict[str, Any], *, model: bool, optimizer: bool,
              rng_state: dict[str, Any] | None) -> None:
    """Collective over the engine's world. `common`: plain values (megarl's metadata, lr scheduler);
    `rng_state`: this rank's RNG states (stored for DP rank 0 of each (PP, TP) rank), None: not saved."""
    state: dict[str, Any] = {}
    if model or optimizer:
        state.update(_model_state(engine.chunks))
    if optimizer and engine.optimizer is not None:
        state["optimizer"] = _optimizer_state(engine, is_loading=False)
    preprocess_state_dict_for_uneven_dtensor(state)
    dcp.save(state, storage_writer=dcp.FileSystemWriter(ckpt_dir))
    mine = (_rng_key(), rng_state) if rng_state is not None and parallel_state.get_data_parallel_rank(
        with_context_parallel=True) == 0 else None
    gathered: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, mine)
    if torch.distributed.get_rank() == 0:
        rng = dict(item for item in gathered if item is not None)
        torch.save({**common, **({"rng_state": rng} if rng else {})}, os.path.join(ckpt_dir, _COMMON))


def read_common(ckpt_dir: str) -> dict[str, Any]:
    """What `save_fsdp` wrote to `common.pt` (weights_only: nothing in it runs code)."""
    file = os.path.join(ckpt_dir, _COMMON)
    return safe_torch_load(file, "the common state", file)


def load_fsdp(engine, ckpt_dir: str, *, model: bool, optimizer: bool) -> dict[str, Any] | None:
    """Load what `save_fsdp` wrote into the engine's FSDP chunks (in place). Returns the optimizer
    state for `engine.optimizer.load_state_dict` (None: not asked for)."""
    state: dict[str, Any] = {}
    if model:
        state.update(_model_state(engine.chunks))
    if optimizer and engine.optimizer is not None:
        state["optimizer"] = _optimizer_state(engine, is_loading=True)
    preprocess_state_dict_for_uneven_dtensor(state)
    dcp.load(state, storage_reader=dcp.FileSystemReader(ckpt_dir))
    for i, chunk in enumerate(engine.chunks):
        loaded = state.get("model" if len(engine.chunks) == 1 else f"model{i}")
        if loaded is not None:
            # MegatronFSDP's own keys (the adapter's load_state_dict prefixes them again, and turns strict
            # off for gated linear units)
            chunk.module.load_state_dict(loaded, strict=True)
    return state.get("optimizer")


def rng_state_of_this_rank(common: dict[str, Any]) -> dict[str, Any] | None:
    """The RNG states `save_fsdp` stored for this rank's (PP, TP) rank (None: not saved)."""
    return (common.get("rng_state") or {}).get(_rng_key())
