"""The critic's value head: hidden state -> one scalar per token."""

from __future__ import annotations

import torch
from megatron.core.tensor_parallel import gather_from_sequence_parallel_region
from megatron.core.transformer.transformer_config import TransformerConfig


class ValueHead(torch.nn.Module):
    """Replaces GPTModel's ``output_layer`` in a critic: ``[s, b, h] -> ([s, b, 1], None)``.

    The weight ``[1, h]`` is replicated on every tensor-parallel rank (its input, the final
    hidden state, is identical there). With sequence parallelism the input is split by
    sequence, so the output is gathered and the weight marked ``sequence_parallel`` (its
    gradient is then all-reduced over TP by megatron's ``finalize_model_grads``).
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.sequence_parallel = config.sequence_parallel
        self.weight = torch.nn.Parameter(torch.empty(1, config.hidden_size, dtype=config.params_dtype))
        torch.nn.init.normal_(self.weight, mean=0.0, std=config.init_method_std)
        setattr(self.weight, "sequence_parallel", config.sequence_parallel)

    def forward(self, hidden_states: torch.Tensor, weight=None, runtime_gather_output=None):
        values = torch.nn.functional.linear(hidden_states, self.weight)
        if self.sequence_parallel:
            values = gather_from_sequence_parallel_region(values, tensor_parallel_output_grad=False)
        return values, None
