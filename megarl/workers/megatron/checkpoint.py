"""Megatron dist checkpoints of a `MegatronEngine`: model, optimizer, lr scheduler, RNG. (With
Megatron-FSDP: `<path>/fsdp_dtensor`, same layout only, megarl.workers.megatron.fsdp_checkpoint; the
rest of this describes DDP's `<path>/dist_ckpt`.)

Layout-free: tensors are saved with their global shapes (megatron `dist_checkpointing`,
torch_dist format), so a checkpoint written at TP=2 loads at TP=1 (and other TP/PP
layouts); optimizer state is resharded with the model (non-distributed optimizer, and the
distributed optimizer's reshardable format). RNG states are per (PP, TP) rank and restored
only when the layout is unchanged. `contents` (verl `checkpoint.save_contents` /
`load_contents`): "model", "optimizer", "extra" (lr scheduler, RNG), "hf_model" (an HF
export under `<path>/huggingface`, save only). Every save also writes `<path>/huggingface/`
config.json + tokenizer files (verl does too) and records in the dist checkpoint's common
state how the model was built (`dtype`, `value_head`, `override_transformer_config`), so
`python -m megarl.model_merger` can rebuild it from the checkpoint alone.

A save ends with `<path>/checksums.json` (size + sha256 of every file under `path`; each
rank hashes a share of the files), which the controller verifies before a resume. A full
disk is raised as `StorageError` naming the directory, mount and free space. A resume
applies the current config's optimizer hyperparameters: the lr schedule per
`optim.use_checkpoint_opt_param_scheduler` (megarl.workers.megatron.optim.build_scheduler),
everything else (Adam's betas, ...) always from the config.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from megatron.core import dist_checkpointing, parallel_state
from megatron.core.dist_checkpointing.mapping import ShardedObject
from omegaconf import OmegaConf

from megarl.compat.megatron_core.checkpoint_write import keep_write_errors
from megarl.models import save_hf_checkpoint, save_hf_config, unwrap_chunk
from megarl.models.data_parallel import is_fsdp
from megarl.models.lora import ADAPTER_KEY, adapters, merged_weights
from megarl.utils.checksums import digest_files, list_files, write_manifest
from megarl.utils.storage import raise_if_storage_error
from megarl.workers.megatron.fsdp_checkpoint import FSDP_DIR, load_fsdp, read_common, rng_state_of_this_rank, save_fsdp
from megarl.workers.megatron.fsdp_checkpoint import OPTIMIZER_FORMAT as FSDP_OPTIMIZER_FORMAT

__all__ = ["save_checkpoint", "load_checkpoint", "load_model_only"]

logger = logging.getLogger(__name__)

_CONTENTS = ("model", "optimizer", "extra", "hf_model")
DDP_DIR = "dist_ckpt"


def _check_contents(contents: Sequence[str]) -> None:
    unknown = sorted(set(contents) - set(_CONTENTS))
    if unknown:
        raise ValueError(f"checkpoint contents {unknown} are not supported; choose from {_CONTENTS}")


def _model_sharded_state_dict(chunks: Sequence[torch.nn.Module]) -> dict[str, Any]:
    """Every chunk's sharded state dict; with LoRA adapters only the adapters' (the base is
    model.path's, frozen)."""
    models = [unwrap_chunk(c) for c in chunks]
    lora = bool(adapters(chunks))
    dicts = [{k: v for k, v in m.sharded_state_dict().items() if not lora or ADAPTER_KEY in k} for m in models]
    if len(models) == 1:
        return {"model": dicts[0]}
    return {f"model{i}": d for i, d in enumerate(dicts)}


def _layout() -> dict[str, int]:
    return {
        "tp": parallel_state.get_tensor_model_parallel_world_size(),
        "pp": parallel_state.get_pipeline_model_parallel_world_size(),
        "vpp": parallel_state.get_virtual_pipeline_model_parallel_world_size() or 1,
        "cp": parallel_state.get_context_parallel_world_size(),
        "ep": parallel_state.get_expert_model_parallel_world_size(),
    }


def optimizer_format(engine) -> str:
    """How the optimizer state is written: ``torch`` (megatron's plain optimizer: per-parameter
    tensors, any layout), or for the distributed optimizer megatron's ``distrib_optim_sharding_type``
    as verl picks it: ``dp_reshardable`` (each DP rank's buffers as they are: fast, but loadable
    only at the same TP/PP/EP/CP) or, with ``megatron.dist_ckpt_optim_fully_reshardable``,
    ``fully_reshardable`` (gathered on DP rank 0 into per-parameter form: any layout); with
    Megatron-FSDP ``fsdp_dtensor`` (per-parameter DTensor shards)."""
    if engine.megatron_cfg.use_megatron_fsdp:
        return FSDP_OPTIMIZER_FORMAT
    if not engine.use_distributed_optimizer:
        return "torch"
    return "fully_reshardable" if engine.megatron_cfg.dist_ckpt_optim_fully_reshardable else "dp_reshardable"


def _optimizer_metadata(engine, fmt: str) -> dict[str, Any] | None:
    if fmt == "torch":
        return None
    return {"distrib_optim_sharding_type": fmt, "distrib_optim_fully_reshardable_mem_efficient":
            bool(engine.megatron_cfg.distrib_optim_fully_reshardable_mem_efficient)}


def _check_optimizer_format(engine, saved: str, saved_layout: dict[str, int] | None, path: str) -> None:
    """Refuse, naming the keys, an optimizer state this engine cannot read (before megatron fails deep)."""
    current = optimizer_format(engine)
    if (saved == "torch") != (current == "torch"):
        raise ValueError(
            f"checkpoint {path}: its optimizer state was written {'without' if saved == 'torch' else 'with'} the "
            f"distributed optimizer and this run has megatron.use_distributed_optimizer="
            f"{str(engine.use_distributed_optimizer).lower()}; resume with the same setting, or leave 'optimizer' "
            "out of checkpoint.load_contents")
    if saved == "dp_reshardable" and saved_layout != _layout():
        raise ValueError(
            f"checkpoint {path}: its distributed-optimizer state is dp_reshardable (megatron."
            f"dist_ckpt_optim_fully_reshardable=false when saved), which loads only at the layout it was saved in "
            f"({saved_layout}), not {_layout()}; resume at that layout, or leave 'optimizer' out of "
            "checkpoint.load_contents (save with megatron.dist_ckpt_optim_fully_reshardable=true to change layouts)")


def _rng_sharded_object(state: Any) -> ShardedObject:
    return ShardedObject(
        "rng_state",
        state,
        (parallel_state.get_pipeline_model_parallel_world_size(), parallel_state.get_tensor_model_parallel_world_size()),
        (parallel_state.get_pipeline_model_parallel_rank(), parallel_state.get_tensor_model_parallel_rank()),
        replica_id=parallel_state.get_data_parallel_rank(with_context_parallel=True),
    )


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
        from megatron.core.tensor_parallel import get_cuda_rng_tracker

        state["tracker"] = get_cuda_rng_tracker().get_states()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
        from megatron.core.tensor_parallel import get_cuda_rng_tracker

        get_cuda_rng_tracker().set_states(state["tracker"])


def save_checkpoint(engine, path: str, *, contents: Sequence[str], global_step: int = 0) -> None:
    """Collective over all ranks of the engine's world; writes `<path>/dist_ckpt` (DDP) or
    `<path>/fsdp_dtensor` (Megatron-FSDP, megarl.workers.megatron.fsdp_checkpoint)."""
    _check_contents(contents)
    fsdp = is_fsdp(engine.chunks)
    ckpt_dir = os.path.join(path, FSDP_DIR if fsdp else DDP_DIR)
    if torch.distributed.get_rank() == 0:
        os.makedirs(ckpt_dir, exist_ok=True)
    torch.distributed.barrier()
    fmt = optimizer_format(engine)
    meta = {"global_step": int(global_step), "layout": _layout(), "contents": list(contents),
            "build": _build_record(engine), "optimizer_format": fmt, "data_parallel": "fsdp" if fsdp else "ddp"}
    keep_write_errors()  # megatron-core 0.19.2 drops a failed write's reason (ENOSPC) from its exception
    try:
        if fsdp:
            common = {"megarl": meta}
            if "extra" in contents and engine.scheduler is not None:
                common["lr_scheduler"] = engine.scheduler.state_dict()
            save_fsdp(engine, ckpt_dir, common, model="model" in contents, optimizer="optimizer" in contents,
                      rng_state=_rng_state() if "extra" in contents else None)
        else:
            dist_checkpointing.save(_ddp_state(engine, meta, contents, fmt), ckpt_dir)
        if "hf_model" in contents:
            with merged_weights(engine.chunks):  # LoRA: the merged model
                save_hf_checkpoint(engine.chunks, engine.hf_config, os.path.join(path, "huggingface"),
                                   tokenizer_dir=engine.model_path)
        elif torch.distributed.get_rank() == 0:
            save_hf_config(engine.hf_config, os.path.join(path, "huggingface"), tokenizer_dir=engine.model_path)
        torch.distributed.barrier()
        _write_checksums(path)
    except BaseException as error:  # torch's CheckpointException is a BaseException
        raise_if_storage_error(error, path)
        raise
    torch.distributed.barrier()


def _ddp_state(engine, meta: dict[str, Any], contents: Sequence[str], fmt: str) -> dict[str, Any]:
    """What `dist_checkpointing.save` writes for a DDP engine."""
    state: dict[str, Any] = {"megarl": meta}
    model_sd = _model_sharded_state_dict(engine.chunks)
    if "model" in contents or "optimizer" in contents:
        state.update(model_sd)
    if "optimizer" in contents and engine.optimizer is not None:
        state["optimizer"] = engine.optimizer.sharded_state_dict(model_sd, is_loading=False,
                                                                 metadata=_optimizer_metadata(engine, fmt))
    if "extra" in contents:
        if engine.scheduler is not None:
            state["lr_scheduler"] = engine.scheduler.state_dict()
        state["rng_state"] = _rng_sharded_object(_rng_state())
    return state


def _build_record(engine) -> dict[str, Any]:
    """What besides config.json decides the model's parameters (read by megarl.model_merger)."""
    overrides = engine.megatron_cfg.override_transformer_config
    # plain containers only: the common state is loaded with weights_only=True (megarl.utils.safe_checkpoint)
    overrides = OmegaConf.to_container(overrides, resolve=True) if OmegaConf.is_config(overrides) else dict(overrides)
    record = {"dtype": str(engine.dtype).removeprefix("torch."), "value_head": bool(engine.value_head),
              "override_transformer_config": overrides}
    if engine.lora is not None:  # adapters only: they fit this base and this adapter shape alone
        record["lora"] = _lora_record(engine)
    return record


def _lora_record(engine) -> dict[str, Any]:
    """What an adapter-only checkpoint must be loaded onto: the base (config.json digest, the
    safetensors' names and sizes) and the adapters' rank, alpha and layers."""
    base = engine.model_path
    with open(os.path.join(base, "config.json"), "rb") as f:
        config_sha = hashlib.sha256(f.read()).hexdigest()
    weights = sorted((n, os.path.getsize(os.path.join(base, n))) for n in os.listdir(base) if n.endswith(".safetensors"))
    spec = engine.lora
    return {"base_config_sha256": config_sha, "base_weights": [list(w) for w in weights], "rank": spec.rank,
            "alpha": spec.alpha, "target_modules": list(spec.target_modules), "exclude_modules": list(spec.exclude_modules)}


def _check_lora_record(engine, saved: dict[str, Any] | None, path: str) -> None:
    """Refuse adapters saved for another base model or adapter shape (or a full-model checkpoint)."""
    want = _lora_record(engine) if engine.lora is not None else None
    if saved == want:
        return
    if want is None or saved is None:
        what = "LoRA adapters only" if saved is not None else "a full model"
        raise ValueError(f"checkpoint {path} holds {what}; this run has actor_rollout_ref.model.lora.rank="
                         f"{0 if want is None else want['rank']}: resume with the LoRA settings it was saved with")
    diff = sorted(k for k in want if want[k] != saved.get(k))
    raise ValueError(f"checkpoint {path} holds LoRA adapters for another base model or adapter shape (differs in {diff}): "
                     "resume with the model.path and model.lora.* it was trained with")


def _write_checksums(path: str) -> None:
    """`<path>/checksums.json` of every file under `path`: rank 0 lists them, every rank
    hashes its share (file i on rank i % world), rank 0 writes the merged manifest."""
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    names = [list_files(path) if rank == 0 else None]
    torch.distributed.broadcast_object_list(names, src=0)
    mine = digest_files(path, names[0][rank::world])
    shares: list[Any] = [None] * world
    torch.distributed.all_gather_object(shares, mine)
    if rank == 0:
        write_manifest(path, {name: entry for share in shares for name, entry in share.items()})


def _checkpoint_dir(engine, path: str, fsdp: bool) -> str:
    """`path`'s checkpoint of this engine's data-parallel wrapper; a checkpoint of the other one is
    refused naming the key (DDP's dist checkpoint and FSDP's DTensor shards do not load into each other)."""
    want, other = (FSDP_DIR, DDP_DIR) if fsdp else (DDP_DIR, FSDP_DIR)
    ckpt_dir = os.path.join(path, want)
    if os.path.isdir(ckpt_dir):
        return ckpt_dir
    if os.path.isdir(os.path.join(path, other)):
        key = f"{engine.prefix}.megatron.use_megatron_fsdp"
        raise ValueError(f"checkpoint {path} was written with {key}={str(not fsdp).lower()} ({other}/), which this run "
                         f"({key}={str(fsdp).lower()}) cannot load: resume with {key}={str(not fsdp).lower()}, or start "
                         "a new run (trainer.resume_mode=disable)")
    raise FileNotFoundError(f"no megatron checkpoint at {ckpt_dir}")


def _check_fsdp_layout(meta: dict[str, Any], path: str) -> None:
    if meta.get("layout") != _layout():
        raise ValueError(f"checkpoint {path}: written with Megatron-FSDP at the layout {meta.get('layout')}, which loads "
                         f"only at that layout, not {_layout()} (megarl does not reshard its DTensor shards over "
                         "TP/PP/VPP/CP/EP): resume at that layout, or leave model and optimizer out of "
                         "checkpoint.load_contents")


def load_checkpoint(engine, path: str, *, contents: Sequence[str]) -> dict[str, Any]:
    """Load what `save_checkpoint` wrote: DDP's in any TP/PP layout, Megatron-FSDP's at its own
    TP/PP/VPP/CP/EP layout. Returns its metadata."""
    _check_contents(contents)
    fsdp = is_fsdp(engine.chunks)
    ckpt_dir = _checkpoint_dir(engine, path, fsdp)
    common = read_common(ckpt_dir) if fsdp else dist_checkpointing.load_common_state_dict(ckpt_dir)
    meta = common.get("megarl", {})
    weights = "model" in contents or "optimizer" in contents
    if weights:
        _check_lora_record(engine, meta.get("build", {}).get("lora"), path)
    saved = set(meta.get("contents", []))
    missing = sorted(set(contents) - saved - {"hf_model"})
    if missing:
        raise ValueError(f"checkpoint {path} has no {missing} (it holds {sorted(saved)}); adjust checkpoint.load_contents")
    same_layout = meta.get("layout") == _layout()
    if "extra" in contents and not same_layout:
        logger.info("checkpoint layout %s differs from %s: RNG state not restored", meta.get("layout"), _layout())
    with_optimizer = "optimizer" in contents and engine.optimizer is not None
    if fsdp:
        if weights:
            _check_fsdp_layout(meta, path)
        optimizer_state = load_fsdp(engine, ckpt_dir, model="model" in contents, optimizer=with_optimizer)
        rng_state = rng_state_of_this_rank(common) if "extra" in contents and same_layout else None
    else:
        loaded = _load_ddp(engine, ckpt_dir, path, meta, contents, with_optimizer, "extra" in contents and same_layout)
        optimizer_state, rng_state = loaded.get("optimizer"), loaded.get("rng_state")
    if with_optimizer:
        configured = [{k: v for k, v in group.items() if k != "params"} for group in engine.optimizer.param_groups]
        with torch.no_grad():  # fp32 params: the distributed optimizer's main params are views of the (leaf) params
            engine.optimizer.load_state_dict(optimizer_state)
        _restore_configured_hyperparams(engine, configured)
    if "extra" in contents:
        if engine.scheduler is not None and "lr_scheduler" in common:
            engine.scheduler.load_state_dict(common["lr_scheduler"])
            engine.scheduler.step(increment=0)  # megatron sets weight decay before its loaded values: redo
        if rng_state is not None:
            _set_rng_state(rng_state)
    return meta


def _load_ddp(engine, ckpt_dir: str, path: str, meta: dict[str, Any], contents: Sequence[str], with_optimizer: bool,
              with_rng: bool) -> dict[str, Any]:
    """Load a DDP engine's dist checkpoint: the model in place; returns the loaded optimizer and RNG states."""
    model_sd = _model_sharded_state_dict(engine.chunks)
    request: dict[str, Any] = {}
    if "model" in contents:
        request.update(model_sd)
    if with_optimizer:
        saved = meta.get("optimizer_format")  # None: written before it was recorded, in megatron's default format
        if saved is not None:
            _check_optimizer_format(engine, saved, meta.get("layout"), path)
        request["optimizer"] = engine.optimizer.sharded_state_dict(
            model_sd, is_loading=True, metadata=None if saved is None else _optimizer_metadata(engine, saved))
    if with_rng:
        request["rng_state"] = _rng_sharded_object(None)
    try:
        loaded = dist_checkpointing.load(request, ckpt_dir)
    except Exception as error:  # e.g. megatron's "Global shape mismatch": name the checkpoint
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:500]
        raise RuntimeError(f"{ckpt_dir}: loading the checkpoint into this model failed ({type(error).__name__}: {first}); "
                           "it was written for another model or is damaged") from error
    if "model" in contents:
        _load_model_state(engine.chunks, loaded)
    return loaded


def _restore_configured_hyperparams(engine, configured: list[dict[str, Any]]) -> None:
    """A loaded optimizer state replaces every param-group setting (lr, betas, weight decay and
    megatron's per-group max_lr / min_lr, which the scheduler reads) with the checkpoint's:
    put back the ones built from the current config (``configured``, one dict per group), except
    max_lr / min_lr when `optim.use_checkpoint_opt_param_scheduler` keeps the checkpoint's schedule."""
    keep_schedule = bool(engine.optim_cfg.use_checkpoint_opt_param_scheduler)
    for group, settings in zip(engine.optimizer.param_groups, configured):
        for key, value in settings.items():
            if not (keep_schedule and key in ("max_lr", "min_lr")):
                group[key] = value


def _load_model_state(chunks: Sequence[torch.nn.Module], loaded: dict[str, Any]) -> None:
    """Every tensor of the chunks, or with LoRA every adapter tensor (the base stays model.path's)."""
    models = [unwrap_chunk(c) for c in chunks]
    lora = bool(adapters(chunks))
    for i, m in enumerate(models):
        state = loaded["model"] if len(models) == 1 else loaded[f"model{i}"]
        missing, unexpected = m.load_state_dict(state, strict=not lora)
        missing = [k for k in missing if ADAPTER_KEY in k]
        if missing or unexpected:
            raise ValueError(f"LoRA checkpoint: adapter tensors missing {missing[:5]}, unexpected {unexpected[:5]}")


def load_model_only(chunks: Sequence[torch.nn.Module], path: str) -> None:
    """Initial weights from a dist checkpoint (`megatron.use_dist_checkpointing`).

    `path` is a directory written by `save_checkpoint` (its `dist_ckpt` subdirectory is
    used when present) or a bare dist checkpoint directory with a `model` entry.
    """
    ckpt_dir = os.path.join(path, "dist_ckpt") if os.path.isdir(os.path.join(path, "dist_ckpt")) else path
    loaded = dist_checkpointing.load(_model_sharded_state_dict(chunks), ckpt_dir)
    _load_model_state(chunks, loaded)
