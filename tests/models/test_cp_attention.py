"""SDPACoreAttention under context parallelism (megarl.models.cp_attention) against a hand-written
causal softmax attention over the whole sequence: outputs and the gradients of q, k, v on each
CP rank's load-balanced chunks (gloo, CP = 3; padded rows and packed thd sequences)."""

from __future__ import annotations

import math

import pytest
import torch

from helpers.dist_utils import run_distributed

pytestmark = pytest.mark.slow

HEADS, GROUPS, DIM = 4, 2, 8


def _reference(q, k, v, allowed):
    """q [s, b, n, d], k/v [s, b, g, d], allowed [s, s] (query, key) -> [s, b, n * d]."""
    s, b, n, d = q.shape
    rep = n // k.shape[2]
    k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
    scores = torch.einsum("ibnd,jbnd->bnij", q, k) / math.sqrt(d)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("bnij,jbnd->ibnd", scores.softmax(-1), v).reshape(s, b, n * d)


def _allowed(seq_lens):
    """[T, T] causal within each sequence (block diagonal)."""
    seq = torch.repeat_interleave(torch.arange(len(seq_lens)), torch.tensor(seq_lens))
    pos = torch.arange(len(seq))
    return (seq[:, None] == seq[None]) & (pos[None] <= pos[:, None])


def _body(cases: list[tuple[list[int], int, bool]]) -> list[dict]:
    return [_case(*case) for case in cases]


def _case(seq_lens: list[int], batch: int, packed: bool) -> dict:
    import types

    import torch.distributed as dist
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megarl.models.core_attention import SDPACoreAttention
    from megarl.parallel.context_parallel import cp_token_index
    from megarl.compat.megatron_core.cpu import apply_cpu

    apply_cpu()
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    cp, rank = dist.get_world_size(), dist.get_rank()
    group = dist.group.WORLD
    torch.manual_seed(0)  # the same full tensors on every rank
    total = sum(seq_lens)
    q = torch.randn(total, batch, HEADS, DIM, dtype=torch.float64, requires_grad=True)
    k = torch.randn(total, batch, GROUPS, DIM, dtype=torch.float64, requires_grad=True)
    v = torch.randn(total, batch, GROUPS, DIM, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(total, batch, HEADS * DIM, dtype=torch.float64)
    ref = _reference(q, k, v, _allowed(seq_lens))
    ref.backward(upstream)

    config = TransformerConfig(num_layers=1, hidden_size=HEADS * DIM, num_attention_heads=HEADS, num_query_groups=GROUPS,
                               kv_channels=DIM, attention_dropout=0.0, context_parallel_size=cp)
    attention = SDPACoreAttention(config, 1, AttnMaskType.causal, "self", pg_collection=types.SimpleNamespace(cp=group))
    mine = cp_token_index(seq_lens, cp)[rank]
    local = [t.detach()[mine].clone().requires_grad_(True) for t in (q, k, v)]
    params = None
    if packed:
        cu = torch.tensor([0, *seq_lens], dtype=torch.int32).cumsum(0).to(torch.int32)
        params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cu,
                                 cu_seqlens_kv_padded=cu, max_seqlen_q=max(seq_lens), max_seqlen_kv=max(seq_lens))
        out = attention(*(t[:, 0] for t in local), None, packed_seq_params=params).unsqueeze(1)
    else:
        out = attention(*local, None)
    out.backward(upstream[mine])
    return {
        "out": (out.detach(), ref.detach()[mine]),
        **{f"grad_{n}": (t.grad, full.grad[mine]) for n, t, full in zip("qkv", local, (q, k, v))},
    }


def test_cp_attention_equals_causal_attention_on_the_whole_sequence():
    """CP = 3 (the middle rank holds chunks 1 and 4 of 6): 2 padded rows of one 18-token sequence,
    and 3 packed sequences (each a multiple of 2 x cp)."""
    cp = 3
    cases = [([6 * cp], 2, False), ([4 * cp, 2 * cp, 6 * cp], 1, True)]
    for rank, results in enumerate(run_distributed(_body, cp, cases, timeout=300)):
        for (_, _, packed), result in zip(cases, results):
            for name, (got, want) in result.items():
                torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10, msg=f"rank {rank} packed={packed}: {name}")
