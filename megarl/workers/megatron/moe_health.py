"""MoE health of one pass: how evenly the routers spread the tokens over the experts, how sure they are, and
the load-balancing loss they would pay, per MoE layer, summarised over layers (the step's ``moe/*`` metrics).

Per MoE layer, over the valid tokens of the pass (padding excluded), with ``n_e`` the tokens routed to expert
``e`` (the experts the layer used: its own top-k, or the replayed routes), ``p`` each token's router
distribution over all E experts (softmax of the logits; a sigmoid router's scores normalised to sum 1),
``P_e`` its sum over the T tokens, and top-k ``k``:

* ``moe/expert_load_max_over_mean/{mean,max}``: ``max_e n_e / mean_e n_e`` (1 = every expert as busy; the
  busiest expert bounds an expert-parallel step);
* ``moe/load_balancing_loss/{mean,max}``: ``E / (k T^2) * sum_e P_e n_e``, megatron's switch load-balancing
  loss without its coefficient (1 when balanced; what ``moe_aux_loss_coeff`` times it adds to the loss when
  the model trains with one);
* ``moe/router_entropy/mean``: the mean entropy of ``p`` in nats (``log E`` = undecided, 0 = one expert).

Counted by forward hooks on megatron's ``TopKRouter`` modules (the logits recomputed from the router's input:
one ``[tokens, hidden] x [hidden, E]`` product per layer), summed over the ranks that hold other tokens or
layers (megarl.workers.megatron.router_replay.sum_over_token_owners).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from megatron.core.transformer.moe.router import TopKRouter

from megarl.workers.megatron.inputs import MicroBatchInputs
from megarl.workers.megatron.router_replay import sum_over_token_owners

__all__ = ["MoEHealth"]


class MoEHealth:
    """The MoE routers of one model's chunks on this rank, observed during the passes between :meth:`begin`
    and :meth:`end` (a ForwardHooks of run_schedule: it learns each forward's valid tokens).

    Args:
        chunks: the model chunks (any wrappers).
        moe_layers: decoder index of each MoE layer (megarl.models.moe_config.moe_layers).
        num_experts, top_k: the model's routed experts and experts per token.
        sequence_parallel: the model runs with sequence parallelism (TP > 1).
    """

    def __init__(self, chunks: Sequence[torch.nn.Module], moe_layers: Sequence[int], num_experts: int, top_k: int,
                 sequence_parallel: bool) -> None:
        ordinal = {layer: i for i, layer in enumerate(moe_layers)}
        self.sequence_parallel = sequence_parallel
        self.num_layers = len(moe_layers)
        self.num_experts, self.top_k = num_experts, top_k
        self.valid: torch.Tensor | None = None  # [tokens] of the running forward; None: not observing
        self.active = False
        self._sums: torch.Tensor | None = None  # [MoE layers, 2 E + 2]: n_e, P_e, entropy sum, tokens
        for chunk in chunks:
            for module in chunk.modules():
                if isinstance(module, TopKRouter):
                    module.register_forward_hook(self._hook(ordinal[module.layer_number - 1]))

    def _hook(self, layer: int):
        def observe(router: TopKRouter, args, output) -> None:
            if self.valid is None:  # not in a pass, or a recomputing backward (its forward was counted)
                return
            with torch.no_grad():
                hidden = args[0].reshape(-1, args[0].shape[-1])[self.valid.to(args[0].device)]
                bias = getattr(router, "bias", None)
                logits = F.linear(hidden.float(), router.weight.float(), None if bias is None else bias.float())
                if router.score_function == "sigmoid":
                    scores = torch.sigmoid(logits)
                    probs = scores / scores.sum(-1, keepdim=True).clamp_min(1e-20)
                else:
                    probs = torch.softmax(logits, -1)
                entropy = -(probs * probs.clamp_min(1e-30).log()).sum()
                routed = output[1].reshape(-1, output[1].shape[-1])[self.valid.to(args[0].device)].sum(0).float()
                row = torch.cat([routed, probs.sum(0), entropy[None], torch.tensor([float(len(hidden))], device=probs.device)])
                if self._sums is None:
                    self._sums = torch.zeros(self.num_layers, row.numel(), dtype=torch.float64, device=row.device)
                self._sums[layer] += row.double()

        return observe

    def begin(self) -> None:
        self.active = True
        self._sums = None

    def before_forward(self, chunk: torch.nn.Module, inputs: MicroBatchInputs, rows: list[int]) -> None:
        if self.active:
            self.valid = inputs.token_mask.reshape(-1)[inputs.router_positions(self.sequence_parallel)]

    def after_forward(self, chunk: torch.nn.Module, inputs: MicroBatchInputs, rows: list[int]) -> None:
        self.valid = None

    def end(self) -> dict[str, float]:
        """The pass's ``moe/*`` metrics (see the module docstring), the same on every rank (collective)."""
        self.active = False
        width = 2 * self.num_experts + 2
        sums = self._sums.cpu() if self._sums is not None else torch.zeros(self.num_layers, width, dtype=torch.float64)
        sums = sum_over_token_owners(sums, self.sequence_parallel)
        sums = sums[sums[:, -1] > 0]  # layers that saw tokens
        if not len(sums):
            return {}
        e = self.num_experts
        load, probs, entropy, tokens = sums[:, :e], sums[:, e:2 * e], sums[:, -2], sums[:, -1]
        ratio = load.max(-1).values / load.mean(-1).clamp_min(1e-12)
        aux = e / (self.top_k * tokens**2) * (probs * load).sum(-1)
        return {"moe/expert_load_max_over_mean/mean": float(ratio.mean()),
                "moe/expert_load_max_over_mean/max": float(ratio.max()),
                "moe/load_balancing_loss/mean": float(aux.mean()), "moe/load_balancing_loss/max": float(aux.max()),
                "moe/router_entropy/mean": float((entropy / tokens).mean())}
