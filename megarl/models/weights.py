"""Load HF safetensors into megatron chunks; export chunks back as full HF tensors."""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from safetensors import safe_open

from megarl.models.converters import TE_ALIASES, ParamSource, build_plan, dims_of, from_shards, is_split, to_shard

__all__ = ["has_hf_value_head", "load_hf_weights", "export_hf_weights", "save_hf_checkpoint", "unwrap_chunk", "find_param",
           "converted_tensors"]

logger = logging.getLogger(__name__)

_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
    "merges.txt", "tokenizer.model", "added_tokens.json", "chat_template.jinja",
    "generation_config.json",
)


def unwrap_chunk(chunk: torch.nn.Module) -> torch.nn.Module:
    """The GPTModel inside DDP / Float16Module wrappers."""
    while hasattr(chunk, "module") and not hasattr(chunk, "decoder"):
        chunk = chunk.module
    return chunk


def _meta(chunks: Sequence[torch.nn.Module]) -> dict:
    model = unwrap_chunk(chunks[0])
    meta = getattr(model, "megarl_meta", None)
    if meta is None:
        raise ValueError("chunks were not built by megarl.models.build_model (no megarl_meta)")
    return meta


def find_param(params: dict[str, torch.nn.Parameter], name: str) -> torch.nn.Parameter | None:
    """Parameter ``name`` (local-spec spelling) or its transformer-engine spelling."""
    if name in params:
        return params[name]
    for local, te in TE_ALIASES.items():
        if "{expert}" in local:
            prefix, suffix = local.split("{expert}")
            head, _, tail = name.partition(prefix)
            if tail and tail.endswith(suffix):
                expert = tail[: -len(suffix)]
                te_name = head + te.format(expert=expert)
                if te_name in params:
                    return params[te_name]
        elif name.endswith(local) and name[: -len(local)] + te in params:
            return params[name[: -len(local)] + te]
    return None




def converted_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The tensors the converters load and export, by name: every parameter, and the routers'
    ``expert_bias`` buffers (GLM-4.5's ``e_score_correction_bias``: state, not trained)."""
    tensors: dict[str, torch.Tensor] = dict(model.named_parameters())
    tensors.update((name, buf) for name, buf in model.named_buffers() if name.endswith("router.expert_bias"))
    return tensors


class _SafetensorsDir:
    """Lazy reader over the (possibly sharded) safetensors of an HF model directory."""

    def __init__(self, hf_dir: str | os.PathLike) -> None:
        self.hf_dir = Path(hf_dir)
        index = self.hf_dir / "model.safetensors.index.json"
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
            self.file_of = {name: self.hf_dir / fname for name, fname in weight_map.items()}
        else:
            files = sorted(self.hf_dir.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"no *.safetensors in {self.hf_dir}")
            self.file_of = {}
            for path in files:
                with safe_open(str(path), framework="pt") as handle:
                    self.file_of.update({name: path for name in handle.keys()})
        self._handles: dict[Path, object] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.file_of

    def get(self, name: str) -> torch.Tensor:
        if name not in self.file_of:
            raise KeyError(f"{self.hf_dir}: HF weight {name!r} not found in the safetensors files")
        path = self.file_of[name]
        if path not in self._handles:
            self._handles[path] = safe_open(str(path), framework="pt")
        return self._handles[path].get_tensor(name)

    def get_row(self, name: str, index: int) -> torch.Tensor:
        """``get(name)[index]``, reading only that row (one expert of a stacked expert tensor)."""
        if name not in self.file_of:
            raise KeyError(f"{self.hf_dir}: HF weight {name!r} not found in the safetensors files")
        path = self.file_of[name]
        if path not in self._handles:
            self._handles[path] = safe_open(str(path), framework="pt")
        return self._handles[path].get_slice(name)[index]


def _local_view():
    """(pp_rank, ep_rank, tp (rank, size), etp (rank, size)) of this process."""
    return (
        parallel_state.get_pipeline_model_parallel_rank(),
        parallel_state.get_expert_model_parallel_rank(),
        (parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_tensor_model_parallel_world_size()),
        (parallel_state.get_expert_tensor_parallel_rank(), parallel_state.get_expert_tensor_parallel_world_size()),
    )


def has_hf_value_head(model_path: str | os.PathLike) -> bool:
    """Whether the HF dir carries a score head (`score.weight`: a saved critic, or a
    `*ForSequenceClassification` reward model)."""
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


@torch.no_grad()
def load_hf_weights(chunks: Sequence[torch.nn.Module], hf_dir: str | os.PathLike) -> None:
    """Copy this rank's shard of every parameter from the HF safetensors in ``hf_dir``.

    Every parameter of every chunk is written (cast to its dtype) except a critic's value
    head when ``hf_dir`` has no ``score.weight`` (it keeps its initialisation).

    Raises:
        KeyError: an HF weight the model needs is missing (names it and the directory).
        ValueError: a chunk parameter no table rule covers, or a shape mismatch.
    """
    meta = _meta(chunks)
    hf_config, value_head = meta["hf_config"], meta["value_head"]
    models = [unwrap_chunk(c) for c in chunks]
    plan = build_plan(hf_config, models[0].config, value_head=value_head)
    dims = dims_of(hf_config)
    pp_rank, ep_rank, tp, etp = _local_view()
    reader = _SafetensorsDir(hf_dir)

    params = [converted_tensors(m) for m in models]
    loaded: list[set[int]] = [set() for _ in models]
    for entry in plan:
        if entry.pp_rank != pp_rank or entry.ep_rank not in (None, ep_rank):
            continue
        if entry.stacked:
            local = entry.stacked // parallel_state.get_expert_model_parallel_world_size()
            for index in range(local):
                param = _stacked_param(params[entry.vp_stage], entry, index)
                (name,) = entry.hf_names
                shard = to_shard(entry.kind, [reader.get_row(name, ep_rank * local + index)], *etp, dims)
                _copy_checked(param, shard, hf_dir, entry)
                loaded[entry.vp_stage].add(id(param))
            continue
        param = find_param(params[entry.vp_stage], entry.mcore_name)
        if param is None:
            raise ValueError(f"megatron parameter {entry.mcore_name!r} (chunk {entry.vp_stage}) not found")
        if value_head and entry.hf_names == ("score.weight",) and "score.weight" not in reader:
            logger.info("%s has no score.weight: the value head keeps its initialisation", hf_dir)
            loaded[entry.vp_stage].add(id(param))
            continue
        rank, size = etp if entry.tp_group == "etp" else tp
        shard = to_shard(entry.kind, [reader.get(n) for n in entry.hf_names], rank, size, dims)
        _copy_checked(param, shard, hf_dir, entry)
        loaded[entry.vp_stage].add(id(param))

    for index, chunk_params in enumerate(params):
        missing = [n for n, p in chunk_params.items() if id(p) not in loaded[index]]
        if missing:
            raise ValueError(f"no HF weight rule for megatron parameters {missing} (chunk {index})")


def _stacked_param(params: dict[str, torch.nn.Parameter], entry: ParamSource, index: int) -> torch.nn.Parameter:
    """Local expert ``index``'s parameter of a stacked-expert entry."""
    name = entry.mcore_name.format(expert=index)
    param = find_param(params, name)
    if param is None:
        raise ValueError(f"megatron parameter {name!r} (chunk {entry.vp_stage}) not found")
    return param


def _copy_checked(param: torch.Tensor, shard: torch.Tensor, hf_dir, entry: ParamSource) -> None:
    if shard.shape != param.shape:
        raise ValueError(
            f"{hf_dir}: {entry.hf_names} give shape {tuple(shard.shape)} for megatron "
            f"{entry.mcore_name!r}, which has {tuple(param.shape)}"
        )
    param.copy_(shard.to(param.dtype))


def _stacked_full(entry: ParamSource, params: dict[str, torch.nn.Parameter], dims) -> torch.Tensor:
    """The HF tensor of a stacked-expert entry ``[E, ...]``: each local expert gathered over expert TP, then
    every EP rank's experts gathered in global order. Collective over ETP and EP."""
    local = entry.stacked // parallel_state.get_expert_model_parallel_world_size()
    mine = torch.stack([from_shards(entry.kind, _gather_shard(entry, _stacked_param(params, entry, index)), dims)[0]
                        for index in range(local)])
    if local == entry.stacked:
        return mine
    group = parallel_state.get_expert_model_parallel_group()
    parts = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, mine, group=group)
    return torch.cat(parts)


def _broadcast_full(tensors: list[torch.Tensor] | None, count: int, src_stage: int, device) -> list[torch.Tensor]:
    """Send ``count`` tensors from pipeline stage ``src_stage`` to every stage."""
    group = parallel_state.get_pipeline_model_parallel_group()
    src = dist.get_process_group_ranks(group)[src_stage]
    out = []
    for i in range(count):
        header = torch.zeros(8, dtype=torch.int64, device=device)
        if tensors is not None:
            t = tensors[i]
            header[0], header[1] = t.dim(), _DTYPES.index(t.dtype)
            header[2 : 2 + t.dim()] = torch.tensor(t.shape)
        dist.broadcast(header, src=src, group=group)
        if tensors is not None:
            buf = tensors[i].contiguous()
        else:
            ndim, code = int(header[0]), int(header[1])
            buf = torch.empty(header[2 : 2 + ndim].tolist(), dtype=_DTYPES[code], device=device)
        dist.broadcast(buf, src=src, group=group)
        out.append(buf)
    return out


def _gather_shard(entry: ParamSource, param: torch.Tensor, from_owner: bool = True) -> list[torch.Tensor]:
    """Every TP (or ETP) rank's shard of ``entry``, after fetching the owner's expert (``from_owner``; else
    this rank holds it)."""
    shard = param.detach()
    if from_owner and entry.ep_rank is not None and parallel_state.get_expert_model_parallel_world_size() > 1:
        ep_group = parallel_state.get_expert_model_parallel_group()
        shard = shard.clone()
        dist.broadcast(shard, src=dist.get_process_group_ranks(ep_group)[entry.ep_rank], group=ep_group)
    if not is_split(entry.kind):
        return [shard]
    group = (
        parallel_state.get_expert_tensor_parallel_group()
        if entry.tp_group == "etp"
        else parallel_state.get_tensor_model_parallel_group()
    )
    size = dist.get_world_size(group)
    if size == 1:
        return [shard]
    shards = [torch.empty_like(shard) for _ in range(size)]
    dist.all_gather(shards, shard.contiguous(), group=group)
    return shards


@torch.no_grad()
def export_hf_weights(
    chunks: Sequence[torch.nn.Module], hf_config, experts: Collection[int] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, full_tensor)`` for every HF parameter, in a fixed order.

    Collective: every rank of the model-parallel group (TP x PP x EP, all ranks of the
    world in practice) must iterate this generator in lockstep to the end. Every rank
    receives the same full tensors (gathered over TP/ETP, broadcast from the owning
    EP rank and pipeline stage), on the model's device and in its dtype. A tied LM head
    is not yielded (HF ties it to ``model.embed_tokens.weight``); a critic yields its value
    head as ``score.weight``. Tensors are fresh or detached views: copy before changing
    the model.

    ``experts``: the routed experts (global ids) this rank wants, all of them its own (a consumer whose
    experts are sharded like this rank's, e.g. vLLM with expert parallelism): only those experts are
    yielded, from this rank's parameters without a collective over the expert-parallel group (still
    gathered over expert TP); ValueError when one lives on another rank or pipeline stage. Experts stacked
    in one HF tensor (GPT-OSS) are yielded whole all the same (gathered over EP): the consumer takes its rows.
    """
    meta = _meta(chunks)
    models = [unwrap_chunk(c) for c in chunks]
    plan = build_plan(hf_config, models[0].config, value_head=meta["value_head"])
    dims = dims_of(hf_config)
    pp_rank, ep_rank, _, _ = _local_view()
    pp_size = parallel_state.get_pipeline_model_parallel_world_size()
    params = [converted_tensors(m) for m in models]
    device = next(models[0].parameters()).device

    for entry in plan:
        if not entry.export:
            continue
        own = experts is not None and entry.expert is not None
        if own and entry.expert not in experts:
            continue
        if own and (entry.ep_rank != ep_rank or entry.pp_rank != pp_rank):
            raise ValueError(f"expert {entry.expert} of layer {entry.layer} lives on expert-parallel rank {entry.ep_rank}, "
                             f"pipeline stage {entry.pp_rank}; this rank is {ep_rank}, stage {pp_rank}")
        full = None
        if entry.pp_rank == pp_rank and entry.stacked:
            full = [_stacked_full(entry, params[entry.vp_stage], dims)]
        elif entry.pp_rank == pp_rank:
            param = find_param(params[entry.vp_stage], entry.mcore_name)
            if param is None:
                raise ValueError(f"megatron parameter {entry.mcore_name!r} (chunk {entry.vp_stage}) not found")
            full = from_shards(entry.kind, _gather_shard(entry, param, from_owner=not own), dims)
            if own:
                yield from zip(entry.hf_names, full)
                continue
        if pp_size > 1:
            full = _broadcast_full(full, len(entry.hf_names), entry.pp_rank, device)
        yield from zip(entry.hf_names, full)


def save_hf_checkpoint(
    chunks: Sequence[torch.nn.Module],
    hf_config,
    out_dir: str | os.PathLike,
    *,
    tokenizer_dir: str | os.PathLike | None = None,
    max_shard_bytes: int = 5 * 1024**3,
) -> None:
    """Export the model as an HF directory (collective; global rank 0 writes).

    Writes ``model.safetensors`` (or ``model-0000i-of-0000n.safetensors`` plus
    ``model.safetensors.index.json`` beyond ``max_shard_bytes``), ``config.json`` and, when
    ``tokenizer_dir`` is given, its tokenizer files. ``config.json``'s ``dtype`` is the dtype
    most of the written weights have (a bf16 run of a model whose config says float32 writes
    bf16: transformers loads ``dtype="auto"`` by it). Files get the mode the umask gives a new
    file (safetensors writes 0600).
    """
    from safetensors.torch import save_file

    writer = not dist.is_initialized() or dist.get_rank() == 0
    out = Path(out_dir)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in export_hf_weights(chunks, hf_config):
        if not writer:
            continue
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor.detach().to("cpu", copy=True).contiguous()
        size += nbytes
    if writer:
        out.mkdir(parents=True, exist_ok=True)
        if len(shards) == 1:
            save_file(shards[0], str(out / "model.safetensors"), metadata={"format": "pt"})
        else:
            weight_map = {}
            for i, shard in enumerate(shards, start=1):
                fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                save_file(shard, str(out / fname), metadata={"format": "pt"})
                weight_map.update({name: fname for name in shard})
            total = sum(t.numel() * t.element_size() for s in shards for t in s.values())
            (out / "model.safetensors.index.json").write_text(
                json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
            )
        counts: dict[torch.dtype, int] = {}
        for tensor in (t for shard in shards for t in shard.values()):
            counts[tensor.dtype] = counts.get(tensor.dtype, 0) + tensor.numel()
        if counts:
            hf_config = copy.deepcopy(hf_config)
            hf_config.dtype = max(counts, key=counts.get)
        save_hf_config(hf_config, out, tokenizer_dir=tokenizer_dir)
        for path in out.glob("*.safetensors"):
            path.chmod(0o666 & ~_umask())
    if dist.is_initialized():
        dist.barrier()


def _umask() -> int:
    """This process's umask, read without changing it (os.umask sets it, racing other threads)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    raise OSError("no Umask line in /proc/self/status")


def save_hf_config(hf_config, out_dir: str | os.PathLike, *, tokenizer_dir: str | os.PathLike | None = None) -> None:
    """``config.json`` of ``hf_config`` and the tokenizer files of ``tokenizer_dir`` into ``out_dir``
    (the HF directory minus the weights; call on one rank)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf_config.save_pretrained(str(out))
    if tokenizer_dir is not None:
        for fname in _TOKENIZER_FILES:
            if (Path(tokenizer_dir) / fname).exists():
                shutil.copy2(Path(tokenizer_dir) / fname, out / fname)
