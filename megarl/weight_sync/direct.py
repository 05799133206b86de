"""Direct weight sync: the actor's weights are written straight into vLLM's own parameters.

The generic path (:func:`~megarl.weight_sync.transport.stream_in_process` into vLLM's
``reload_weights``) packs every byte into bucket buffers and then lets vLLM rebuild each
layer from checkpoint-format tensors: two extra copies, and vLLM's layer-wise reload
machinery on top. Where vLLM computes straight from its parameters, a plain copy of each
tensor into the matching rows of the parameter is the same load, exactly:

* CUDA only: vLLM's CPU kernels repack weights after loading (oneDNN / SGL handles), so
  a copy into the parameter would not reach them;
* dense families whose vLLM layers keep checkpoint layout (``DIRECT_ARCHITECTURES``),
  unquantized;
* fused parameters are row blocks in checkpoint order: ``qkv_proj`` = [q; k; v],
  ``gate_up_proj`` = [gate; up]; padded vocab rows (embedding, LM head) are zeroed at every
  sync (vLLM's own loader zeroes them; a level-2 sleep leaves them undefined).

Two ways to fill the views:

* **Shard to shard** (``local``): actor TP = rollout TP (1 or more), one pipeline stage, no
  expert parallelism, and this rank's vLLM TP rank is its Megatron TP rank. Then rank r's
  Megatron shard of every tensor *is* what vLLM rank r holds: Megatron's ``linear_qkv`` shard
  is the q/k/v rows of the rank's query groups (interleaved per group), ``linear_fc1`` the
  rank's gate then up rows, a row-parallel weight the rank's columns, the vocabulary the
  rank's rows (when both pad the vocabulary to the same per-rank size). So the sync is one
  local copy per tensor, no collective and no extra memory, replayed as one CUDA graph while
  the parameters stay where they are.
* **Gathered** (rollout TP = 1, any actor layout): the bucketed exporter gathers every TP
  shard straight into the views it can take (same dtype) and copies the rest through its
  ring (:mod:`megarl.weight_sync.tp_gather`; PP / EP layouts go through the per-tensor export).

:func:`direct_targets` builds ``hf_name -> view of the vLLM parameter`` and checks that the
views cover every parameter of the engine; anything else returns ``None`` with the reason,
and the caller keeps the generic path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from megarl.weight_sync.plan import ReshardPlan, TensorSlot
from megarl.weight_sync.transport import SyncStats

DIRECT_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
# vLLM fused parameter -> its HF parts, in row order
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class DirectSyncError(RuntimeError):
    """A tensor written into vLLM's parameter differs from the exported one."""


@dataclass(frozen=True)
class ActorShards:
    """What the direct path needs to know of the actor's layout on this rank."""

    tp: int
    tp_rank: int
    pp: int
    ep: int
    chunks: int  # virtual pipeline chunks
    vocab_rows: int  # rows of the (padded) vocabulary each TP rank holds

    @property
    def one_stage(self) -> bool:
        return self.pp == 1 and self.ep == 1 and self.chunks == 1


@dataclass
class DirectTargets:
    """``views[hf_name]``: the rows of a vLLM parameter that tensor fills (its shape on this
    rank); ``padding``: the padded vocab rows, zeroed at every sync; ``local``: shard to shard
    (see the module docstring), else gathered."""

    views: dict[str, torch.Tensor]
    local: bool
    tp: int = 1
    tp_rank: int = 0
    padding: list[torch.Tensor] = field(default_factory=list)
    _pairs: tuple[tuple, list[tuple[str, torch.Tensor, torch.Tensor]]] | None = None  # (param pointers, pairs)
    _graph: "torch.cuda.CUDAGraph | None" = None  # the copies of ``_pairs`` (CUDA)

    @torch.no_grad()
    def load_from(self, chunks, hf_config, *, bucket_size_bytes: int, integrity_check: bool, stats: SyncStats) -> None:
        """Write the Megatron model's weights into vLLM's parameters.

        Shard to shard: one ``copy_`` per tensor straight from the local Megatron shard (views
        cached while the parameters stay where they are), replayed as one CUDA graph; the
        check runs when the graph is captured (a replay repeats the same copies between the
        same addresses). Gathered: the bucketed export, gathering straight into the views it
        can take (same dtype), copied into the others. ``integrity_check``: every view is
        compared bitwise with its source (one host sync).
        """
        from megarl.models import unwrap_chunk
        from megarl.weight_sync.tp_gather import export_hf_weights_bucketed

        start = time.perf_counter()
        for rows in self.padding:
            rows.zero_()
        if self.local:
            pairs, built = self._local_pairs(unwrap_chunk(chunks[0]), hf_config)
            self._replay_copies(pairs, built)
            self._account(pairs, integrity_check and built, stats)
        else:
            dtype = unwrap_chunk(chunks[0]).config.params_dtype
            lent = {name: view for name, view in self.views.items() if view.dtype == dtype}
            export = export_hf_weights_bucketed(chunks, hf_config, bucket_size_bytes=bucket_size_bytes, destinations=lent)
            self._copy(((name, self._view_for(name, tensor), tensor) for name, tensor in export), integrity_check, stats)
        stats.buckets += 1
        stats.seconds += time.perf_counter() - start

    def forget_sources(self) -> None:
        """Drop the cached copies (and the source tensors they hold): for sources that live only
        for one sync (LoRA's merged weights, megarl.models.lora.merged_weights)."""
        self._pairs, self._graph = None, None

    def _view_for(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        if name not in self.views:
            raise KeyError(f"direct weight sync: the export has {name!r}, which no vLLM parameter takes")
        view = self.views[name]
        if tuple(tensor.shape) != tuple(view.shape):
            raise ValueError(f"direct weight sync: {name!r} has shape {tuple(tensor.shape)}, the vLLM "
                             f"parameter rows it fills have {tuple(view.shape)}")
        return view

    def _replay_copies(self, pairs, built: bool) -> None:
        """One graph launch instead of a ``copy_`` launch per tensor (~20 us of host time each)."""
        if built or self._graph is None:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                for _, view, source in pairs:
                    view.copy_(source)  # no allocation: the graph's memory pool stays empty
            self._graph = graph
        self._graph.replay()

    def _local_pairs(self, model: torch.nn.Module, hf_config) -> tuple[list[tuple[str, torch.Tensor, torch.Tensor]], bool]:
        """(hf_name, vLLM view, Megatron view) per tensor of this rank's shard, and whether they
        were (re)built now (an offload / onload moves the parameters)."""
        from megarl.models.converters import Dims, build_plan, dims_of
        from megarl.models.converters.transforms import views_of_unsharded
        from megarl.models.weights import converted_tensors, find_param

        params = converted_tensors(model)
        pointers = tuple(p.data_ptr() for p in params.values())
        if self._pairs is not None and self._pairs[0] == pointers:
            return self._pairs[1], False
        full = dims_of(hf_config)
        pairs = []
        for entry in build_plan(hf_config, model.config, value_head=model.megarl_meta["value_head"]):
            if not entry.export:
                continue
            param = find_param(params, entry.mcore_name).detach()
            rows = param.shape[0] if param.dim() else 1
            dims = Dims(full.num_heads // self.tp, full.num_query_groups // self.tp, full.head_dim,
                        max(0, min(rows, full.vocab_size - self.tp_rank * rows)))  # vocab: this rank's real rows
            for name, source in zip(entry.hf_names, views_of_unsharded(entry.kind, param, dims)):
                view = self.views.get(name)
                if view is None or view.numel() != source.numel():
                    raise ValueError(f"direct weight sync: megatron's {entry.mcore_name!r} gives {name!r} with "
                                     f"{source.numel()} elements on this rank; the vLLM rows for it hold "
                                     f"{None if view is None else view.numel()}")
                pairs.append((name, view.view(source.shape), source))
        self._pairs = (pointers, pairs)
        return pairs, True

    def _copy(self, triples, integrity_check: bool, stats: SyncStats) -> None:
        def copied():
            for name, view, source in triples:
                view.copy_(source)  # a no-op when the exporter gathered straight into the view
                yield name, view, source
        self._account(copied(), integrity_check, stats)

    def _account(self, triples, integrity_check: bool, stats: SyncStats) -> None:
        """Count what was written, check that every view was, and compare them bitwise."""
        seen: set[str] = set()
        differs: list[tuple[str, torch.Tensor]] = []
        for name, view, source in triples:
            if integrity_check:
                source = source if source.dtype == view.dtype else source.to(view.dtype)
                as_int = _INT_OF_SIZE[view.element_size()]
                differs.append((name, (view.view(as_int) != source.view(as_int)).any()))
            seen.add(name)
            stats.tensors += 1
            stats.bytes += view.numel() * view.element_size()
        missing = sorted(set(self.views) - seen)
        if missing:
            raise ValueError(f"direct weight sync: the export ended without {len(missing)} tensors vLLM needs: "
                             f"{missing[:8]}{' ...' if len(missing) > 8 else ''}")
        if differs:
            flags = torch.stack([flag for _, flag in differs]).cpu().tolist()  # the one host sync
            bad = [name for (name, _), flag in zip(differs, flags) if flag]
            if bad:
                raise DirectSyncError(f"direct weight sync: vLLM's parameters differ from the export after the copy "
                                      f"for {len(bad)} tensors: {bad[:8]}")


def _local_shape(slot: TensorSlot, tp: int, tp_rank: int, vocab_rows: int) -> tuple[int, ...]:
    """The part of HF tensor ``slot`` that TP rank ``tp_rank`` of ``tp`` holds, where every
    rank holds ``vocab_rows`` rows of the padded vocabulary."""
    kind = slot.source.kind if slot.source is not None else "replicated"
    shape = slot.shape
    if tp == 1 or kind == "replicated":
        return shape
    if kind == "split1":
        return (shape[0], shape[1] // tp)
    if kind == "vocab":
        return (max(0, min(vocab_rows, shape[0] - tp_rank * vocab_rows)), *shape[1:])
    return (shape[0] // tp, *shape[1:])  # split0, and each HF part of qkv / gate_up


def _why_not(model: torch.nn.Module, plan: ReshardPlan, rollout_tp: int, rollout_tp_rank: int,
             actor: ActorShards) -> str:
    """Why the direct path does not apply ('' when it does)."""
    arch = type(model).__name__
    device = next(iter(model.parameters())).device
    if device.type != "cuda":
        return "vLLM's CPU kernels repack weights after loading"
    if arch not in DIRECT_ARCHITECTURES:
        return f"architecture {arch} is not one of {DIRECT_ARCHITECTURES}"
    if _quantized(model):
        return "the engine is quantized"
    if rollout_tp == 1:
        return ""
    if actor.tp != rollout_tp or not actor.one_stage:
        return (f"rollout tensor_model_parallel_size={rollout_tp} takes shards of the actor's layout only at "
                f"actor TP={rollout_tp} with one pipeline stage and no expert parallelism "
                f"(actor TP={actor.tp} PP={actor.pp} EP={actor.ep} chunks={actor.chunks})")
    if rollout_tp_rank != actor.tp_rank:
        return f"vLLM's TP rank {rollout_tp_rank} is not the actor's TP rank {actor.tp_rank} on this process"
    return ""


def direct_targets(model: torch.nn.Module, plan: ReshardPlan, *, rollout_tp: int, rollout_tp_rank: int,
                   actor: ActorShards) -> tuple[DirectTargets | None, str]:
    """Views into ``model`` (vLLM's ``nn.Module`` on this rank) for every tensor of ``plan``, or
    ``None`` and why the direct path does not apply. Decided from shapes alone, so every rank
    of the world decides alike (the caller still agrees on it collectively)."""
    why = _why_not(model, plan, rollout_tp, rollout_tp_rank, actor)
    if why:
        return None, why
    params = dict(model.named_parameters())
    local = rollout_tp == actor.tp and actor.one_stage
    tp, rank = (actor.tp, actor.tp_rank) if local and rollout_tp > 1 else (1, 0)
    shapes = {slot.name: _local_shape(slot, tp, rank, actor.vocab_rows)
              for bucket in plan.buckets for slot in bucket.slots}
    views: dict[str, torch.Tensor] = {}
    filled: dict[str, int] = {}  # vLLM parameter -> rows covered
    for pname, param in params.items():
        module, _, leaf = pname.rpartition(".")
        owner, _, fused = module.rpartition(".")
        parts = [f"{owner}.{p}.{leaf}" for p in FUSED[fused]] if fused in FUSED else [pname]
        row = 0
        for hf in parts:
            if hf not in shapes:
                return None, f"no exported tensor {hf!r} for vLLM parameter {pname!r}"
            rows = shapes[hf][0] if len(shapes[hf]) else 1
            views[hf] = param.data[row : row + rows] if param.dim() else param.data
            row += rows
        filled[pname] = row
        fits = not param.dim() or (tuple(param.shape[1:]) == tuple(shapes[parts[0]][1:]) and row <= param.shape[0])
        if not fits:
            return None, f"vLLM parameter {pname!r} {tuple(param.shape)} does not hold {parts} {[shapes[p] for p in parts]}"
    padded = [name for name, param in params.items() if param.dim() and filled[name] < param.shape[0]]
    for pname in padded:  # every row belongs to a tensor, except padded vocab rows
        if not pname.endswith(("embed_tokens.weight", "lm_head.weight")):
            return None, f"vLLM parameter {pname!r} has {params[pname].shape[0]} rows, the export fills {filled[pname]}"
        if tp > 1 and params[pname].shape[0] != actor.vocab_rows:
            return None, (f"vLLM pads the vocabulary to {params[pname].shape[0]} rows per rank, megatron to "
                          f"{actor.vocab_rows}: the shards do not line up")
    if tp > 1:
        for pname in ("model.embed_tokens.weight", "lm_head.weight"):
            if pname in params and params[pname].shape[0] != actor.vocab_rows:
                return None, (f"vLLM's {pname} has {params[pname].shape[0]} rows on this rank, megatron's shard "
                              f"{actor.vocab_rows}: the shards do not line up")
    # tied embeddings: vLLM has one parameter for both
    tied_head = "lm_head.weight" in shapes and "model.embed_tokens.weight" in shapes and "lm_head.weight" not in params
    tied = {"lm_head.weight"} if tied_head else set()
    extra = sorted(set(shapes) - set(views) - tied)
    if extra:
        return None, f"exported tensors with no vLLM parameter: {extra[:8]}"
    for name in tied:
        views[name] = views["model.embed_tokens.weight"]
    padding = [params[pname].data[filled[pname]:] for pname in padded]
    return DirectTargets(views, local=local, tp=tp, tp_rank=rank, padding=padding), ""


def _quantized(model: torch.nn.Module) -> bool:
    methods = {type(getattr(m, "quant_method", None)).__name__ for m in model.modules()} - {"NoneType"}
    return bool(methods - {"UnquantizedLinearMethod", "UnquantizedEmbeddingMethod"})
