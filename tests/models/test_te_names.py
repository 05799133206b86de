"""The weight converter against transformer-engine's parameter names (CPU: no TE needed).

megatron-core's TE layer spec fuses each RMSNorm into the linear after it
(`input_layernorm` -> `self_attention.linear_qkv.layer_norm_weight`, `pre_mlp_layernorm` ->
`mlp.linear_fc1.layer_norm_weight`). The names below were read off a TE-spec GPTModel built
by megarl on an H100 (TE 2.20.2, megatron-core 0.16.1, 2026-11-23, benchmarks/RESULTS.md);
every rule of the converter plan must find exactly one of them, and none may be left over.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from megatron.core.transformer.transformer_config import TransformerConfig

from megarl.models.converters import build_plan
from megarl.models.weights import find_param

# Seen on the H100: layer 0 and the non-layer parameters of a Qwen2 (QKV bias, tied embeddings).
TE_QWEN2_SEEN = [
    "embedding.word_embeddings.weight",
    "decoder.layers.0.self_attention.linear_proj.weight",
    "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight",
    "decoder.layers.0.self_attention.linear_qkv.weight",
    "decoder.layers.0.self_attention.linear_qkv.bias",
    "decoder.layers.0.mlp.linear_fc1.layer_norm_weight",
    "decoder.layers.0.mlp.linear_fc1.weight",
    "decoder.layers.0.mlp.linear_fc2.weight",
    "decoder.final_layernorm.weight",
]


def _te_names(num_layers: int, *, lm_head: bool, qk_norm: bool = False, bias: bool = True) -> list[str]:
    """TE-spec names of a dense model: the seen layer-0 names repeated per layer."""
    layer0 = [n for n in TE_QWEN2_SEEN if ".layers.0." in n and (bias or not n.endswith(".bias"))]
    if qk_norm:  # TENorm modules of their own (not fused), same names as the local spec
        layer0 += ["decoder.layers.0.self_attention.q_layernorm.weight",
                   "decoder.layers.0.self_attention.k_layernorm.weight"]
    names = [n for n in TE_QWEN2_SEEN if ".layers." not in n]
    names += [n.replace(".layers.0.", f".layers.{i}.") for i in range(num_layers) for n in layer0]
    return names + (["output_layer.weight"] if lm_head else [])


def _plan_names(hf_config) -> list[str]:
    mcore = TransformerConfig(num_layers=hf_config.num_hidden_layers, hidden_size=hf_config.hidden_size,
                              num_attention_heads=hf_config.num_attention_heads, pipeline_dtype=torch.float32)
    return [e.mcore_name for e in build_plan(hf_config, mcore)]


@pytest.mark.parametrize("name", ["qwen2_tied", "qwen2", "qwen3", "llama"])
def test_every_plan_rule_finds_exactly_one_te_parameter(name):
    small = dict(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2)
    hf = {
        "qwen2_tied": lambda: transformers.Qwen2Config(**small, tie_word_embeddings=True),
        "qwen2": lambda: transformers.Qwen2Config(**small, tie_word_embeddings=False),
        "qwen3": lambda: transformers.Qwen3Config(**small, head_dim=8, tie_word_embeddings=False),
        "llama": lambda: transformers.LlamaConfig(**small, tie_word_embeddings=False),
    }[name]()
    te = _te_names(3, lm_head=not hf.tie_word_embeddings, qk_norm=name == "qwen3", bias=name.startswith("qwen2"))
    params = {n: torch.nn.Parameter(torch.zeros(1)) for n in te}
    found = []
    for mcore_name in _plan_names(hf):
        param = find_param(params, mcore_name)
        assert param is not None, f"{name}: no TE parameter for plan rule {mcore_name}"
        found.append(next(n for n, p in params.items() if p is param))
    assert sorted(found) == sorted(te), f"{name}: unmapped TE parameters {sorted(set(te) - set(found))}"


def test_local_names_still_win_over_te_aliases():
    """A local-spec model (no fused norms) resolves to its own parameters."""
    params = {"decoder.layers.0.input_layernorm.weight": torch.nn.Parameter(torch.zeros(1)),
              "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight": torch.nn.Parameter(torch.ones(1))}
    got = find_param(params, "decoder.layers.0.input_layernorm.weight")
    assert got is params["decoder.layers.0.input_layernorm.weight"]
