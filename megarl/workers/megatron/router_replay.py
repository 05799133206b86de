"""MoE routing replay (verl's ``megatron.router_replay.mode``): a pass's routers send each token to the
experts another pass chose, or record their own choice for a later pass.

* R3 (``replay`` of the rollout's routes): the experts vLLM routed each token to during the rollout
  (``routed_experts`` from megarl.workers.route_capture). Training then computes the log-probs of the model
  the tokens were sampled from, up to kernel differences, instead of a model whose routers flipped some
  near-tied experts (the issue-35 gap: mean 0.015, max 0.38 at EP=2 without it).
* R2: the old-log-prob pass ``record``\\ s its routers' choices (returned as ``routed_experts``) and the update
  replays them, so the importance ratio compares the same experts.

Megatron-Core (0.16.1 and 0.19) has the mechanism: with ``moe_enable_routing_replay`` every ``TopKRouter``
gets a ``RouterReplay`` whose top-k can be given (``REPLAY_FORWARD``), taken from a FIFO by activation
recompute in backward (``REPLAY_BACKWARD``) or recorded (``RECORD``). megarl walks each model's own routers
(the class's global registry also holds the reference's and the critic's, which share the process), keyed
by their global ``layer_number`` (pipeline and virtual-pipeline offsets included), and lays the routes out
as the tokens (``MicroBatchInputs.routes``; per forward this rank's tokens after the context-parallel and
sequence-parallel splits, sequence-major as the router flattens them).

A row without a route (-1: a token vLLM never computed, such as each sample's last, or padding) is routed
by the router's own top-k, never to expert 0 (a repeated expert would halve the token's weight and break
the all-to-all dispatcher's split sizes). :func:`_replay_topk` is that fallback around
``RouterReplay.get_replay_topk`` (same signature in megatron-core 0.16.1 and 0.19), installed on the
instances megarl walks. It also counts, per pass, the valid token-layer rows routed natively and the
replayed rows where the router's own choice differs (``router_replay/<pass>/native_frac`` /
``differs_frac``).
"""

from __future__ import annotations

import types
from collections.abc import Sequence

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction

from megarl.workers.megatron.inputs import MicroBatchInputs

__all__ = ["RoutingReplay", "REPLAY", "RECORD", "check_routes", "sum_over_token_owners"]

REPLAY, RECORD = "replay", "record"


def sum_over_token_owners(values: torch.Tensor, sequence_parallel: bool) -> torch.Tensor:
    """Sum per-rank token statistics over the ranks holding other tokens or layers of the same
    model: data- and context-parallel ranks, pipeline stages, and tensor-parallel ranks under sequence
    parallelism (without it they see the same tokens)."""
    groups = [parallel_state.get_data_parallel_group(with_context_parallel=True),
              parallel_state.get_pipeline_model_parallel_group()]
    if sequence_parallel:
        groups.append(parallel_state.get_tensor_model_parallel_group())
    out = values
    for group in groups:
        if dist.get_world_size(group) > 1:
            if dist.get_backend(group) == "nccl":
                out = out.cuda()
            dist.all_reduce(out, group=group)
    return out.cpu()


def check_routes(routes: torch.Tensor, num_experts: int, rows: Sequence[int], key: str) -> None:
    """Refuse rows a router cannot replay: an expert id past ``num_experts`` or one repeated in a row (a
    repeated expert halves the token's weight and breaks the dispatch). ``routes`` ``[b, S, layers, top-k]`` of
    the batch's ``rows``."""
    valid = (routes >= 0).all(-1)
    bad = valid & ((routes >= num_experts).any(-1) | (routes.sort(-1).values.diff(dim=-1) == 0).any(-1))
    if bad.any():
        row, pos, layer = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{key}: row {rows[row]} position {pos} MoE layer {layer} routes to "
                         f"{routes[row, pos, layer].tolist()} (expert ids must be distinct and < {num_experts}); "
                         "the routes do not belong to this model")


class _PassStats:
    """Token-layer rows of one pass on this rank: valid, routed natively, replayed but unlike the router's choice
    (kept on the routers' device: no host sync per router)."""

    def __init__(self) -> None:
        self.counts: torch.Tensor | None = None
        self.valid: torch.Tensor | None = None  # [tokens] of the running forward: which are real tokens

    def add(self, counted: torch.Tensor) -> None:
        self.counts = counted if self.counts is None else self.counts + counted

    def take(self) -> torch.Tensor:
        counts, self.counts = self.counts, None
        return torch.zeros(3, dtype=torch.float64) if counts is None else counts.double().cpu()


def _replay_topk(self: RouterReplay, stats: _PassStats, scores: torch.Tensor, topk: int, num_groups=None,
                 group_topk=None, default_compute_topk=None):
    """``RouterReplay.get_replay_topk`` with -1 rows routed natively (see the module docstring)."""
    action = self.router_replay_action
    if action not in (RouterReplayAction.REPLAY_FORWARD, RouterReplayAction.REPLAY_BACKWARD):
        return RouterReplay.get_replay_topk(self, scores, topk, num_groups, group_topk, default_compute_topk)
    target = self.target_topk_idx if action is RouterReplayAction.REPLAY_FORWARD else self.replay_backward_list.pop(0)
    target = target.to(scores.device, torch.long)
    _, native = default_compute_topk(scores, topk, num_groups, group_topk)
    missing = (target < 0).any(-1)
    top = torch.where(missing[:, None], native, target)
    if action is RouterReplayAction.REPLAY_FORWARD and stats.valid is not None:
        valid = stats.valid.to(scores.device)
        differs = (native.sort(-1).values != top.sort(-1).values).any(-1)
        stats.add(torch.stack([valid.sum(), (valid & missing).sum(), (valid & ~missing & differs).sum()]))
    return scores.gather(1, top), top


class RoutingReplay:
    """The routers of one Megatron model's chunks on this rank, replaying or recording per pass.

    A pass: :meth:`begin`, then every ``run_schedule`` calls :meth:`before_forward` / :meth:`after_forward`
    around each chunk's forward, the engine :meth:`end_schedule` after each schedule; :meth:`recorded` (RECORD)
    and :meth:`end` close the pass (both collective over the model's ranks).

    Args:
        chunks: the model chunks (any wrappers; built with ``moe_enable_routing_replay``).
        moe_layers: decoder index of each MoE layer (megarl.models.moe_config.moe_layers): the layer axis of routes.
        sequence_parallel: the model runs with sequence parallelism (TP > 1).
    """

    def __init__(self, chunks: Sequence[torch.nn.Module], moe_layers: Sequence[int], sequence_parallel: bool) -> None:
        ordinal = {layer: i for i, layer in enumerate(moe_layers)}
        self.num_layers = len(moe_layers)
        self.sequence_parallel = sequence_parallel
        self.stats = _PassStats()
        self.routers: dict[int, list[tuple[int, RouterReplay]]] = {}
        for chunk in chunks:
            found = [(ordinal[m.layer_number - 1], m.router_replay) for m in chunk.modules()
                     if isinstance(m, TopKRouter) and m.router_replay is not None]
            for _, replay in found:
                replay.get_replay_topk = types.MethodType(
                    lambda rr, *args, **kw: _replay_topk(rr, self.stats, *args, **kw), replay)
            self.routers[id(chunk)] = found
        if not any(self.routers.values()) and parallel_state.get_pipeline_model_parallel_world_size() == 1:
            raise RuntimeError("routing replay: the model has no MoE router with a RouterReplay "
                               "(build it with moe_enable_routing_replay=True)")
        self.mode: str | None = None
        # a training schedule whose activation recompute re-runs the routers takes each forward's routes again
        self.backward_replay = False
        self._recorded: dict[int, tuple[list[int], torch.Tensor]] = {}  # RECORD: per micro-batch (rows, routes)

    # ------------------------------------------------------------------ a pass
    def begin(self, mode: str) -> None:
        """Start a pass that ``mode``\\ s (REPLAY: each micro-batch's ``inputs.routes``; RECORD)."""
        self.mode = mode
        self.stats.take()
        self._recorded = {}

    def before_forward(self, chunk: torch.nn.Module, inputs: MicroBatchInputs, rows: list[int]) -> None:
        """Arm ``chunk``'s routers for its forward on ``inputs`` (called by run_schedule)."""
        positions = inputs.router_positions(self.sequence_parallel)
        self.stats.valid = inputs.token_mask.reshape(-1)[positions]
        if self.mode == REPLAY:
            if inputs.routes is None:
                raise ValueError("routing replay: the micro-batch has no routes (batch key routed_experts)")
            local = inputs.routes.reshape(-1, *inputs.routes.shape[2:])[positions]  # [tokens, MoE layers, top-k]
        for layer, replay in self.routers[id(chunk)]:
            if self.mode == REPLAY:
                replay.set_target_indices(local[:, layer])
                replay.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
            else:
                replay.set_router_replay_action(RouterReplayAction.RECORD)

    def after_forward(self, chunk: torch.nn.Module, inputs: MicroBatchInputs, rows: list[int]) -> None:
        """REPLAY: a recomputing backward takes this forward's routes from the FIFO (else nobody does: dropped);
        RECORD: keep the routers' choices at the rows' positions."""
        self.stats.valid = None
        routers = self.routers[id(chunk)]
        if self.mode == REPLAY:
            for _, replay in routers:
                if self.backward_replay:
                    replay.set_router_replay_action(RouterReplayAction.REPLAY_BACKWARD)
                else:
                    replay.replay_backward_list.clear()
            return
        if not routers:
            return
        b, length = inputs.input_ids.shape
        top_k = routers[0][1].recorded_topk_idx.shape[-1]
        layout = torch.full((b * length, self.num_layers, top_k), -1, dtype=torch.int16)
        positions = inputs.router_positions(self.sequence_parallel).cpu()
        for layer, replay in routers:
            layout[positions, layer] = replay.recorded_topk_idx.to("cpu", torch.int16)
        layout = layout.view(b, length, self.num_layers, top_k)
        valid, token_mask = inputs.valid_mask.cpu(), inputs.token_mask.cpu()
        original = torch.full((*valid.shape, self.num_layers, top_k), -1, dtype=torch.int16)
        original[valid] = layout[token_mask]
        _, earlier = self._recorded.get(id(inputs), (rows, original))  # another virtual stage of this micro-batch
        self._recorded[id(inputs)] = (rows, torch.maximum(earlier, original))

    def end_schedule(self, chunks: Sequence[torch.nn.Module]) -> None:
        """After a schedule: no forward's routes are still needed."""
        for chunk in chunks:
            for _, replay in self.routers[id(chunk)]:
                replay.clear_indices()

    def recorded(self, num_rows: int, seq_len: int) -> torch.Tensor:
        """RECORD: the pass's routes ``[num_rows, seq_len, MoE layers, top-k]`` int16 in the batch's rows and
        positions (-1 on padding), the same on every rank (collective: every rank recorded its tokens' and its
        layers' part)."""
        parts = list(self._recorded.values())
        top_k = parts[0][1].shape[-1] if parts else 0
        top_k = int(_max_over_model(torch.tensor([top_k]), self.sequence_parallel))
        out = torch.full((num_rows, seq_len, self.num_layers, top_k), -1, dtype=torch.int16)
        for rows, routes in parts:
            out[torch.as_tensor(rows)] = routes
        return _max_over_model(out, self.sequence_parallel)

    def disarm(self, chunks: Sequence[torch.nn.Module]) -> None:
        """End the pass on this rank: every router routes natively again."""
        for chunk in chunks:
            for _, replay in self.routers[id(chunk)]:
                replay.clear_indices()
                replay.clear_router_replay_action()
        self.mode = None

    def end(self, chunks: Sequence[torch.nn.Module]) -> dict[str, float]:
        """:meth:`disarm`, then the pass's shares of valid token-layer rows (summed over the ranks: collective):
        ``native_frac`` routed by the router's own top-k for want of a route, ``differs_frac`` of the replayed
        ones where that top-k differs from the route."""
        self.disarm(chunks)
        counts = sum_over_token_owners(self.stats.take(), self.sequence_parallel)
        valid = max(float(counts[0]), 1.0)
        return {"native_frac": float(counts[1]) / valid,
                "differs_frac": float(counts[2]) / max(float(counts[0] - counts[1]), 1.0)}


def _max_over_model(values: torch.Tensor, sequence_parallel: bool) -> torch.Tensor:
    """Element-wise max over the ranks that hold other tokens or layers of the same rows: tensor-parallel ranks
    under sequence parallelism, context-parallel ranks, pipeline stages (-1 marks what a rank does not know)."""
    groups = [parallel_state.get_context_parallel_group(), parallel_state.get_pipeline_model_parallel_group()]
    if sequence_parallel:
        groups.append(parallel_state.get_tensor_model_parallel_group())
    wide = values.to(torch.int32)
    for group in groups:
        if dist.get_world_size(group) > 1:
            if dist.get_backend(group) == "nccl":
                wide = wide.cuda()
            dist.all_reduce(wide, op=dist.ReduceOp.MAX, group=group)
    return wide.cpu().to(values.dtype)
