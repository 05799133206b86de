"""SDPACoreAttention against a hand-written softmax attention (no processes)."""

from __future__ import annotations

import math

import torch
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig

from megarl.models.core_attention import SDPACoreAttention


def _attention(heads=4, groups=2, head_dim=8, layer=1, **window):
    config = TransformerConfig(num_layers=2, hidden_size=heads * head_dim, num_attention_heads=heads,
                               num_query_groups=groups, kv_channels=head_dim, attention_dropout=0.0, **window)
    return SDPACoreAttention(config, layer, AttnMaskType.causal, "self", pg_collection=object()).eval()


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


def _window_allowed(s: int, width: int) -> torch.Tensor:
    """[s, s]: query i sees keys i - width + 1 .. i (HF's sliding_window = width)."""
    i, j = torch.arange(s)[:, None], torch.arange(s)[None, :]
    return (j <= i) & (j > i - width)


def test_sliding_window_layers_mask_far_keys_and_global_layers_do_not():
    torch.manual_seed(2)
    s, b, width = 7, 2, 3
    q, k, v = torch.randn(s, b, 4, 8), torch.randn(s, b, 2, 8), torch.randn(s, b, 2, 8)
    window = {"window_size": (width - 1, 0), "window_attn_skip_freq": [1, 0]}  # layer 1 local, layer 2 global
    local, full = _attention(layer=1, **window), _attention(layer=2, **window)
    torch.testing.assert_close(local(q, k, v, None), _reference(q, k, v, _window_allowed(s, width).expand(b, s, s)))
    torch.testing.assert_close(full(q, k, v, None), _reference(q, k, v, torch.ones(b, s, s, dtype=torch.bool).tril()))
    # with a padding mask, and packed: the window is counted within each sequence
    pad = torch.zeros(b, s, dtype=torch.bool)
    pad[0, :2] = True
    got = local(q, k, v, pad[:, None, None, :])
    valid = ~pad.T
    ref = _reference(q, k, v, _window_allowed(s, width) & ~pad[:, None, :])
    torch.testing.assert_close(got[valid], ref[valid])
    cu = torch.tensor([0, 2, 7], dtype=torch.int32)
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=5, max_seqlen_kv=5)
    packed = local(q[:, 0], k[:, 0], v[:, 0], None, packed_seq_params=params)
    for lo, hi in ((0, 2), (2, 7)):
        ref = _reference(q[lo:hi, :1], k[lo:hi, :1], v[lo:hi, :1], _window_allowed(hi - lo, width)[None])
        torch.testing.assert_close(packed[lo:hi], ref[:, 0])
