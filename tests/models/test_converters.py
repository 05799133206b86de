"""Layout transforms and placement plans, against hand-derived layouts (no processes)."""

from __future__ import annotations

import pytest
import torch
import transformers
from megatron.core.transformer.transformer_config import TransformerConfig

from megarl.models.converters import Dims, build_plan, from_shards, to_shard

DIMS = Dims(num_heads=4, num_query_groups=2, head_dim=2, vocab_size=5)


def _rows(n: int, start: int = 0) -> torch.Tensor:
    return torch.arange(start, start + n, dtype=torch.float32)[:, None].repeat(1, 3)


def test_qkv_interleaves_query_groups_and_splits_by_group():
    q, k, v = _rows(8), _rows(4, 100), _rows(4, 200)  # 4 heads x 2, 2 groups x 2
    shards = [to_shard("qkv", [q, k, v], r, 2, DIMS) for r in range(2)]
    # Group g: its 2 query heads (4 rows), then its k head, then its v head.
    expected_rank0 = torch.cat([q[0:4], k[0:2], v[0:2]])
    expected_rank1 = torch.cat([q[4:8], k[2:4], v[2:4]])
    assert torch.equal(shards[0], expected_rank0) and torch.equal(shards[1], expected_rank1)
    back = from_shards("qkv", shards, DIMS)
    assert all(torch.equal(a, b) for a, b in zip(back, [q, k, v]))


def test_qkv_bias_1d():
    q, k, v = torch.arange(8.0), torch.arange(100.0, 104), torch.arange(200.0, 204)
    fused = to_shard("qkv", [q, k, v], 0, 1, DIMS)
    assert fused[:6].tolist() == [0, 1, 2, 3, 100, 101]
    assert all(torch.equal(a, b) for a, b in zip(from_shards("qkv", [fused], DIMS), [q, k, v]))


def test_gate_up_each_shard_is_gate_part_then_up_part():
    gate, up = _rows(4), _rows(4, 10)
    shards = [to_shard("gate_up", [gate, up], r, 2, DIMS) for r in range(2)]
    assert torch.equal(shards[1], torch.cat([gate[2:], up[2:]]))
    back = from_shards("gate_up", shards, DIMS)
    assert torch.equal(back[0], gate) and torch.equal(back[1], up)


def test_vocab_pads_to_tp_multiple_and_export_drops_padding():
    emb = _rows(5)
    shards = [to_shard("vocab", [emb], r, 2, DIMS) for r in range(2)]
    assert [s.shape[0] for s in shards] == [3, 3]
    assert torch.equal(shards[1][2], torch.zeros(3))
    assert torch.equal(from_shards("vocab", shards, DIMS)[0], emb)


def test_row_parallel_splits_dim1():
    w = torch.arange(12.0).reshape(2, 6)
    assert torch.equal(to_shard("split1", [w], 1, 3, DIMS), w[:, 2:4])


def _moe_config() -> transformers.PretrainedConfig:
    return transformers.Qwen3MoeConfig(
        vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=8,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=8, tie_word_embeddings=False,
    )


def test_plan_places_layers_by_pp_and_vpp_and_experts_by_ep():
    hf = _moe_config()
    mcore = TransformerConfig(
        num_layers=8, hidden_size=16, num_attention_heads=2, pipeline_model_parallel_size=2,
        virtual_pipeline_model_parallel_size=2, expert_model_parallel_size=2, num_moe_experts=4,
        moe_ffn_hidden_size=8, pipeline_dtype=torch.float32, use_cpu_initialization=True,
    )
    plan = build_plan(hf, mcore)
    by_hf = {name: e for e in plan for name in e.hf_names}
    # Interleaved: chunk (pp, vp) holds layers [2 * (2 * vp + pp), +2).
    layer5 = by_hf["model.layers.5.self_attn.o_proj.weight"]
    assert (layer5.pp_rank, layer5.vp_stage) == (0, 1)
    assert layer5.mcore_name == "decoder.layers.1.self_attention.linear_proj.weight"
    expert3 = by_hf["model.layers.6.mlp.experts.3.up_proj.weight"]
    assert (expert3.pp_rank, expert3.vp_stage, expert3.ep_rank, expert3.tp_group) == (1, 1, 1, "etp")
    assert expert3.mcore_name == "decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight"
    assert expert3.hf_names == (
        "model.layers.6.mlp.experts.3.gate_proj.weight",
        "model.layers.6.mlp.experts.3.up_proj.weight",
    )
    assert (by_hf["model.embed_tokens.weight"].pp_rank, by_hf["lm_head.weight"].pp_rank) == (0, 1)
    # Every HF name appears exactly once; export order follows the global layer order.
    names = [n for e in plan for n in e.hf_names]
    assert len(names) == len(set(names))
    layers = [e.layer for e in plan if e.layer is not None]
    assert layers == sorted(layers)


def test_plan_tied_embedding_copy_on_last_stage_is_load_only():
    hf = transformers.Qwen2Config(vocab_size=16, hidden_size=16, intermediate_size=32,
                                  num_hidden_layers=2, num_attention_heads=2,
                                  tie_word_embeddings=True)
    mcore = TransformerConfig(num_layers=2, hidden_size=16, num_attention_heads=2,
                              pipeline_model_parallel_size=2, pipeline_dtype=torch.float32)
    tied = [e for e in build_plan(hf, mcore) if e.mcore_name == "output_layer.weight"]
    assert len(tied) == 1 and tied[0].hf_names == ("model.embed_tokens.weight",)
    assert not tied[0].export and tied[0].pp_rank == 1
    critic = build_plan(hf, mcore, value_head=True)
    assert [e.hf_names for e in critic if e.mcore_name == "output_layer.weight"] == [("score.weight",)]


def test_unknown_kind_is_rejected():
    with pytest.raises(ValueError, match="unknown layout kind"):
        to_shard("diagonal", [torch.zeros(2)], 0, 1, DIMS)
