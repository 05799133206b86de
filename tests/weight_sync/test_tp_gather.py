"""The bucketed TP export (grouped all_gathers into a ring buffer) equals the
per-tensor export bit for bit, on CPU over gloo, for ring sizes that hold several
tensors, one tensor, or less than the largest tensor (row chunks into lent
destinations, or a buffer of its own), with GQA models of one and of two query groups
per TP rank (q/k/v sliced in place, or packed before the gather)."""

from __future__ import annotations

import pytest

from helpers.dist_utils import run_distributed
from tp_gather_body import bucketed_equals_per_tensor

pytestmark = pytest.mark.slow

# ring sizes in bytes: whole model, ~one layer part, smaller than embedding/MLP tensors
SIZES = [1 << 22, 96 << 10, 40 << 10, 3 << 10]


def _tiny(out_dir, kv_heads: int, tie: bool):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        # odd vocab: padded rows on the last TP rank, exported in row chunks
        vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=kv_heads, head_dim=8,
        max_position_embeddings=64, tie_word_embeddings=tie,
    )
    torch.manual_seed(kv_heads)
    model = Qwen2ForCausalLM(cfg).to(torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    model.save_pretrained(out_dir, safe_serialization=True)
    return str(out_dir)


@pytest.mark.parametrize("kv_heads,tie", [(2, True), (4, False)])
def test_bucketed_export_equals_per_tensor_export(tmp_path, kv_heads, tie):
    hf_dir = _tiny(tmp_path / "m", kv_heads, tie)
    results = run_distributed(bucketed_equals_per_tensor, 2, hf_dir, SIZES, timeout=240)
    for rank, res in enumerate(results):
        assert res["tensors"] > 10
        assert res["failures"] == [], f"rank {rank}: {res['failures']}"
