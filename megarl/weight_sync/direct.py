"""Direct weight sync: the export is written straight into vLLM's own parameters.

The generic path (:func:`~megarl.weight_sync.transport.stream_in_process` into vLLM's
``reload_weights``) packs every byte into bucket buffers and then lets vLLM rebuild each
layer from checkpoint-format tensors: two extra copies, and vLLM's layer-wise reload
machinery on top. Where vLLM computes straight from its parameters, a plain copy of each
HF tensor into the matching rows of the parameter is the same load, exactly:

* CUDA only: vLLM's CPU kernels repack weights after loading (oneDNN / SGL handles), so
  a copy into the parameter would not reach them;
* dense families whose vLLM layers keep checkpoint layout (``DIRECT_ARCHITECTURES``),
  unquantized, rollout TP = 1 (each parameter holds the whole tensor);
* fused parameters are row blocks in checkpoint order: ``qkv_proj`` = [q; k; v],
  ``gate_up_proj`` = [gate; up]; padded vocab rows (embedding, LM head) are zeroed once,
  as vLLM's own loader does.

:func:`direct_targets` builds ``hf_name -> view of the vLLM parameter`` and checks that
the views cover every parameter of the engine; anything else returns ``None`` with the
reason, and the caller keeps the generic path. With the views lent as ``destinations``
the TP>1 exporter gathers straight into vLLM's memory (no ring, no copy); at TP = 1 each
exported tensor is one ``copy_``. Extra device memory: none beyond the exporter's ring.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from megarl.weight_sync.plan import ReshardPlan
from megarl.weight_sync.transport import SyncStats

DIRECT_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
# vLLM fused parameter -> its HF parts, in row order
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class DirectSyncError(RuntimeError):
    """A tensor written into vLLM's parameter differs from the exported one."""


@dataclass
class DirectTargets:
    """``views[hf_name]``: the rows of a vLLM parameter that tensor fills (HF shape)."""

    views: dict[str, torch.Tensor]
    _pairs: tuple[tuple, list[tuple[str, torch.Tensor, torch.Tensor]]] | None = None  # (param pointers, pairs)
    _graph: "torch.cuda.CUDAGraph | None" = None  # the copies of ``_pairs`` (CUDA)

    @torch.no_grad()
    def load_from(self, chunks, hf_config, *, bucket_size_bytes: int, integrity_check: bool, stats: SyncStats) -> None:
        """Write the Megatron model's weights into vLLM's parameters.

        TP = PP = EP = 1: one ``copy_`` per tensor straight from the Megatron parameter (views,
        cached while the parameters stay where they are). Otherwise the bucketed export,
        gathering straight into the views it can take (same dtype), copied into the others.
        ``integrity_check``: every view is compared bitwise with its source (one host sync).
        At TP = PP = EP = 1 on CUDA the copies are one CUDA graph, captured when the views are
        built and replayed while the parameters stay put; the check runs when the graph is
        captured (a replay repeats the same copies between the same addresses).
        """
        from megatron.core import parallel_state as ps

        from megarl.models import unwrap_chunk
        from megarl.weight_sync.tp_gather import export_hf_weights_bucketed

        start = time.perf_counter()
        if len(chunks) == 1 and all(size() == 1 for size in (
                ps.get_tensor_model_parallel_world_size, ps.get_pipeline_model_parallel_world_size,
                ps.get_expert_model_parallel_world_size)):
            # direct_targets gives views on CUDA only, so the copies can always be a graph
            pairs, built = self._unsharded_pairs(unwrap_chunk(chunks[0]), hf_config)
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

    def _unsharded_pairs(self, model: torch.nn.Module, hf_config) -> tuple[list[tuple[str, torch.Tensor, torch.Tensor]], bool]:
        """(hf_name, vLLM view, Megatron view) per tensor, and whether they were (re)built now."""
        from megarl.models.converters import build_plan, dims_of
        from megarl.models.converters.transforms import views_of_unsharded
        from megarl.models.weights import _find_param, converted_tensors

        params = converted_tensors(model)
        pointers = tuple(p.data_ptr() for p in params.values())  # offload moves parameters: rebuild then
        if self._pairs is not None and self._pairs[0] == pointers:
            return self._pairs[1], False
        dims, pairs = dims_of(hf_config), []
        for entry in build_plan(hf_config, model.config, value_head=model.megarl_meta["value_head"]):
            if entry.export:
                param = _find_param(params, entry.mcore_name).detach()
                for name, source in zip(entry.hf_names, views_of_unsharded(entry.kind, param, dims)):
                    view = self.views.get(name)
                    if view is None or view.numel() != source.numel():
                        raise ValueError(f"direct weight sync: megatron's {entry.mcore_name!r} gives {name!r} with "
                                         f"{source.numel()} elements; the vLLM rows for it hold "
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


def direct_targets(model: torch.nn.Module, plan: ReshardPlan, *, rollout_tp: int,
                   actor_sharded: bool) -> tuple[DirectTargets | None, str]:
    """Views into ``model`` (vLLM's ``nn.Module``) for every tensor of ``plan``, or ``None``
    and why the direct path does not apply. Zeroes the padded vocab rows (once).

    ``actor_sharded`` (actor TP, PP or EP > 1): the exporter's gather straight into vLLM's
    parameters hit an illegal memory access on two H200s (actor TP=2, two vLLM TP=1
    replicas, 2026-11-24); such layouts take the bucketed path until it is fixed and tested.
    """
    arch = type(model).__name__
    params = dict(model.named_parameters())
    device = next(iter(params.values())).device if params else torch.device("cpu")
    why = ("vLLM's CPU kernels repack weights after loading" if device.type != "cuda" else
           f"rollout tensor_model_parallel_size={rollout_tp} (each vLLM parameter holds a shard)" if rollout_tp != 1 else
           "the actor is sharded (TP/PP/EP > 1): gathering into vLLM's parameters is not verified on GPUs" if actor_sharded else
           f"architecture {arch} is not one of {DIRECT_ARCHITECTURES}" if arch not in DIRECT_ARCHITECTURES else
           "the engine is quantized" if _quantized(model) else "")
    if why:
        return None, why
    shapes = {slot.name: slot.shape for bucket in plan.buckets for slot in bucket.slots}
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
    # tied embeddings: vLLM has one parameter for both
    tied_head = "lm_head.weight" in shapes and "model.embed_tokens.weight" in shapes and "lm_head.weight" not in params
    tied = {"lm_head.weight"} if tied_head else set()
    extra = sorted(set(shapes) - set(views) - tied)
    if extra:
        return None, f"exported tensors with no vLLM parameter: {extra[:8]}"
    for name in tied:
        views[name] = views["model.embed_tokens.weight"]
    for pname in padded:  # only once every check passed: vLLM's own loader zeroes them too
        params[pname].data[filled[pname]:].zero_()
    return DirectTargets(views), ""


def _quantized(model: torch.nn.Module) -> bool:
    methods = {type(getattr(m, "quant_method", None)).__name__ for m in model.modules()} - {"NoneType"}
    return bool(methods - {"UnquantizedLinearMethod", "UnquantizedEmbeddingMethod"})
