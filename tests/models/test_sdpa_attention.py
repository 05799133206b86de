"""SDPACoreAttention against a hand-written softmax attention (no processes)."""

from __future__ import annotations

import math

import torch
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig

from megarl.models.spec import SDPACoreAttention


def _attention(heads=4, groups=2, head_dim=8):
    config = TransformerConfig(num_layers=1, hidden_size=heads * head_dim, num_attention_heads=heads,
                               num_query_groups=groups, kv_channels=head_dim, attention_dropout=0.0)
    return SDPACoreAttention(config, 1, AttnMaskType.causal, "self", pg_collection=object()).eval()


def _reference(q, k, v, allowed):
    """q [s, b, n, d], k/v [s, b, g, d], allowed [b, s, s] -> [s, b, n * d]."""
    s, b, n, d = q.shape
    rep = n // k.shape[2]
    k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
    scores = torch.einsum("ibnd,jbnd->bnij", q, k) / math.sqrt(d)
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    out = torch.einsum("bnij,jbnd->ibnd", scores.softmax(-1), v)
    return out.reshape(s, b, n * d)


def test_causal_gqa_with_padding_mask():
    torch.manual_seed(0)
    s, b = 6, 2
    q, k, v = torch.randn(s, b, 4, 8), torch.randn(s, b, 2, 8), torch.randn(s, b, 2, 8)
    pad = torch.zeros(b, s, dtype=torch.bool)
    pad[0, :2] = True  # left padding of sequence 0
    out = _attention()(q, k, v, pad[:, None, None, :])
    allowed = torch.ones(s, s, dtype=torch.bool).tril() & ~pad[:, None, :]
    ref = _reference(q, k, v, allowed)
    valid = ~pad.T  # [s, b]
    torch.testing.assert_close(out[valid], ref[valid])
    assert torch.isfinite(out).all()  # fully padded query rows must not produce NaN


def test_packed_thd_equals_separate_sequences():
    torch.manual_seed(1)
    lens = [3, 5]
    q, k, v = torch.randn(8, 4, 8), torch.randn(8, 2, 8), torch.randn(8, 2, 8)
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                             max_seqlen_q=5, max_seqlen_kv=5)
    out = _attention()(q, k, v, None, packed_seq_params=params)
    assert out.shape == (8, 32)
    start = 0
    for n in lens:
        sl = slice(start, start + n)
        ref = _reference(q[sl, None], k[sl, None], v[sl, None],
                         torch.ones(1, n, n, dtype=torch.bool).tril())
        torch.testing.assert_close(out[sl], ref[:, 0])
        start += n
