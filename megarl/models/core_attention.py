"""Core attention of the local layer spec (megarl.models.spec): SDPA in megatron's core-attention slot.

megatron's local ``DotProductAttention`` allocates its score buffer on CUDA and has no
packed-sequence or context-parallel support, so the local spec uses :class:`SDPACoreAttention`
(context parallelism: :mod:`megarl.models.cp_attention`), and :class:`MLACoreAttention` for
multi-latent attention: megatron's ``MLASelfAttention`` builds its core attention with ``k_channels`` /
``v_channels`` (query/key head dim ``qk_head_dim + qk_pos_emb_head_dim`` differs from the value head
dim) and an explicit ``softmax_scale``; SDPA already handles a value head dim that differs from the
query's, so it only takes those arguments. Shapes (MLA): query/key
``[s, b, np, qk_head_dim + qk_pos_emb_head_dim]``, value ``[s, b, np, v_head_dim]``, output
``[s, b, np * v_head_dim]``.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.utils import is_layer_window_attention

from megarl.models.cp_attention import context_parallel_attention

__all__ = ["MLACoreAttention", "SDPACoreAttention"]

_CAUSAL_TYPES = (AttnMaskType.causal, AttnMaskType.padding_causal)

try:  # torch >= 2.10: flash attention over packed (thd) sequences, CUDA only
    import inspect

    from torch.nn.attention.varlen import varlen_attn as _varlen_attn

    _VARLEN_CAUSAL = (
        {"window_size": (-1, 0)}
        if "window_size" in inspect.signature(_varlen_attn).parameters
        else {"is_causal": True}
    )
except ImportError:  # pragma: no cover - older torch
    _varlen_attn, _VARLEN_CAUSAL = None, {}
_VARLEN_DTYPES = (torch.float16, torch.bfloat16)  # flash attention's; fp32 raises inside it


class SDPACoreAttention(MegatronModule):
    """Core attention through ``torch.nn.functional.scaled_dot_product_attention``.

    Drop-in for megatron's core-attention slot (same constructor and forward
    signature as ``DotProductAttention``). Supports GQA (each group of
    ``heads / query_groups`` consecutive query heads shares one KV head, as in megatron's
    fused QKV layout), causal masking, megatron boolean attention masks
    (``True`` = masked out, broadcastable to ``[b, 1, sq, sk]``; combined with the
    causal mask for causal mask types) and packed ``thd`` sequences through
    ``PackedSeqParams.cu_seqlens_*`` (block-diagonal causal attention), and megatron's sliding
    window (``config.window_size = (left, 0)`` on the layers ``config.window_attn_skip_freq``
    marks: query i sees keys i - left .. i of its own sequence), and megatron's softmax offsets
    (``config.softmax_type``: ``learnable`` is GPT-OSS's attention sinks, one logit per head that
    joins every query's softmax and carries no value; ``off-by-one`` the same with logit 0), which
    SDPA has no argument for: those layers compute the attention eagerly (:meth:`_with_sinks`).
    Under context parallelism (``context_parallel_size > 1``) it runs
    :func:`megarl.models.cp_attention.context_parallel_attention` (causal, no mask, no sinks).

    Shapes: query ``[sq, b, np, hn]`` (``[t, np, hn]`` for thd), key/value
    ``[sk, b, ng, hn]``; output ``[sq, b, np * hn]`` (``[t, np * hn]`` for thd). ``np``/``ng``
    are the heads / query groups of this tensor-parallel rank.
    """

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: Optional[float] = None,
        softmax_scale: Optional[float] = None,
        cp_comm_type: Optional[str] = None,
        pg_collection=None,
    ) -> None:
        super().__init__(config=config)
        self.cp_group = None
        if config.context_parallel_size > 1:  # megarl.models.cp_attention
            self.cp_group = pg_collection.cp if pg_collection is not None else parallel_state.get_context_parallel_group()
        self.attn_mask_type = attn_mask_type
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout
        head_dim = config.kv_channels
        # (left, right) keys each query sees around itself on a sliding-window layer, else None
        self.window = config.window_size if is_layer_window_attention(
            config.window_size, config.window_attn_skip_freq, layer_number) else None
        if self.window is not None and (self.window[1] != 0 or self.cp_group is not None):
            raise NotImplementedError(f"SDPACoreAttention supports causal sliding windows (left, 0) without context "
                                      f"parallelism only; got window_size={config.window_size}")
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
        if config.apply_query_key_layer_scaling:
            raise NotImplementedError("apply_query_key_layer_scaling is not supported by SDPA")
        self.softmax_offset = self._softmax_offset(config, pg_collection)
        if self.softmax_offset is not None and self.cp_group is not None:
            raise NotImplementedError(f"SDPACoreAttention supports softmax_type={config.softmax_type!r} without "
                                      "context parallelism only")

    def _softmax_offset(self, config: TransformerConfig, pg_collection) -> Optional[torch.Tensor]:
        """The per-head sink logit of this TP rank's heads ``[np]`` (megatron's ``DotProductAttention.softmax_offset``:
        a parameter split over TP by heads for ``learnable``, zeros for ``off-by-one``), or None (``vanilla``)."""
        if config.softmax_type == "vanilla":
            return None
        tp = pg_collection.tp.size() if pg_collection is not None else parallel_state.get_tensor_model_parallel_world_size()
        heads = config.num_attention_heads // tp
        if config.softmax_type == "off-by-one":
            self.register_buffer("softmax_offset", torch.zeros(heads, dtype=config.params_dtype), persistent=False)
            return self.softmax_offset
        if config.softmax_type != "learnable":
            raise ValueError(f"softmax_type {config.softmax_type!r} is not supported")
        offset = torch.nn.Parameter(torch.empty(heads, dtype=config.params_dtype))
        if config.perform_initialization:
            config.init_method(offset)
        set_tensor_model_parallel_attributes(offset, is_parallel=True, dim=0, stride=1)
        return offset

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata: Optional[dict] = None):
        """The learnable softmax offset split over TP by heads, as megatron's ``DotProductAttention`` saves it."""
        from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group, make_sharded_tensors_for_checkpoint

        state = {"softmax_offset": self.softmax_offset} if isinstance(self.softmax_offset, torch.nn.Parameter) else {}
        return make_sharded_tensors_for_checkpoint(
            state, prefix, {"softmax_offset": 0}, sharded_offsets,
            tp_group=parallel_state.get_tensor_model_parallel_group(),
            dp_cp_group=ensure_metadata_has_dp_cp_group(metadata)["dp_cp_group"],
        )

    def _packed_allowed(self, params: PackedSeqParams, sq: int, sk: int, device) -> torch.Tensor:
        """[sq, sk] bool: True where query i may attend key j (same sequence, j <= i, and within
        the sliding window)."""
        cu_q = params.cu_seqlens_q_padded if params.cu_seqlens_q_padded is not None else params.cu_seqlens_q
        cu_k = params.cu_seqlens_kv_padded if params.cu_seqlens_kv_padded is not None else params.cu_seqlens_kv
        seq_q = torch.bucketize(torch.arange(sq, device=device), cu_q[1:].to(device), right=True)
        seq_k = torch.bucketize(torch.arange(sk, device=device), cu_k[1:].to(device), right=True)
        pos_q = torch.arange(sq, device=device) - cu_q.to(device)[seq_q]
        pos_k = torch.arange(sk, device=device) - cu_k.to(device)[seq_k]
        same = seq_q[:, None] == seq_k[None, :]
        allowed = same & (pos_k[None, :] <= pos_q[:, None])
        if self.window is not None:
            allowed &= pos_k[None, :] >= pos_q[:, None] - self.window[0]
        return allowed

    def _mask_free(self, query, key, value, attention_mask, packed_params) -> Optional[torch.Tensor]:
        """Kernels that need no materialised mask (the masked path below runs SDPA's slow
        masked kernels: on H200 3-6x slower than cuDNN/flash causal at seq 4096, and
        O(T^2) over a whole packed batch). Returns ``[sq, b, np * hn]`` or None.

        * no padding mask, sq == sk: SDPA ``is_causal`` (cuDNN / flash backend), GQA native;
        * packed thd on CUDA in fp16 / bf16: ``torch.nn.attention.varlen.varlen_attn`` with a causal
          window over each sequence (KV heads repeated: its GQA support varies by torch); it is flash
          attention, which refuses fp32 (an fp32 model takes the masked path).
        A sliding-window or sink layer takes the masked path (SDPA has no window or sink argument).
        """
        if self.window is not None or self.softmax_offset is not None:
            return None
        dropout = self.dropout_p if self.training else 0.0
        sq, b, num_heads, _ = query.shape
        sk, _, num_groups, _ = key.shape
        if packed_params is not None:
            if (_varlen_attn is None or not query.is_cuda or dropout > 0.0 or sq != sk
                    or query.dtype not in _VARLEN_DTYPES):
                return None
            cu_q = packed_params.cu_seqlens_q_padded
            cu_q = cu_q if cu_q is not None else packed_params.cu_seqlens_q
            cu_k = packed_params.cu_seqlens_kv_padded
            cu_k = cu_k if cu_k is not None else packed_params.cu_seqlens_kv
            q, k, v = query[:, 0], key[:, 0], value[:, 0]  # [t, n, hn]
            if num_heads != num_groups:
                k = k.repeat_interleave(num_heads // num_groups, dim=1)
                v = v.repeat_interleave(num_heads // num_groups, dim=1)
            out = _varlen_attn(
                q, k, v, cu_q.to(torch.int32), cu_k.to(torch.int32),
                int(packed_params.max_seqlen_q), int(packed_params.max_seqlen_kv),
                scale=self.softmax_scale, **_VARLEN_CAUSAL,
            )
            return out.reshape(sq, 1, -1)
        if attention_mask is not None or sq != sk:
            return None
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=dropout, scale=self.softmax_scale,
            enable_gqa=num_heads != num_groups,
        )
        return out.permute(2, 0, 1, 3).reshape(sq, b, -1)

    def _context_parallel(self, query, key, value, attention_mask, mask_type, packed_params) -> torch.Tensor:
        """:func:`megarl.models.cp_attention.context_parallel_attention` (causal only; megarl's inputs
        need no padding mask: rows are front-aligned or packed). Same shapes as ``forward``."""
        if attention_mask is not None or mask_type not in _CAUSAL_TYPES:
            raise NotImplementedError(
                "SDPACoreAttention under context parallelism supports causal attention without an attention mask only"
            )
        cu_seqlens = None
        if packed_params is not None:
            cu_seqlens = packed_params.cu_seqlens_q_padded
            cu_seqlens = cu_seqlens if cu_seqlens is not None else packed_params.cu_seqlens_q
        out = context_parallel_attention(
            query, key, value, cp_group=self.cp_group, scale=self.softmax_scale,
            dropout_p=self.dropout_p if self.training else 0.0, cu_seqlens=cu_seqlens,
        )
        return out.squeeze(1) if packed_params is not None else out

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: Optional[torch.Tensor],
        attn_mask_type: Optional[AttnMaskType] = None,
        attention_bias: Optional[torch.Tensor] = None,
        packed_seq_params: Optional[PackedSeqParams] = None,
    ) -> torch.Tensor:
        if attention_bias is not None:
            raise NotImplementedError("attention_bias is not supported by SDPACoreAttention")
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        packed = packed_seq_params is not None and packed_seq_params.qkv_format == "thd"
        if packed:  # [t, n, hn] -> [t, 1, n, hn]
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if self.cp_group is not None:
            return self._context_parallel(query, key, value, attention_mask, mask_type, packed_seq_params if packed else None)
        sq, _, num_heads, _ = query.shape
        sk, _, num_groups, _ = key.shape
        fast = self._mask_free(query, key, value, attention_mask, packed_seq_params if packed else None)
        if fast is not None:
            return fast.squeeze(1) if packed else fast

        # [s, b, n, hn] -> [b, n, s, hn]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        if num_heads != num_groups:
            repeat = num_heads // num_groups
            k = k.repeat_interleave(repeat, dim=1)
            v = v.repeat_interleave(repeat, dim=1)

        if packed:
            allowed = self._packed_allowed(packed_seq_params, sq, sk, q.device)
        elif mask_type in _CAUSAL_TYPES or attention_mask is None:
            allowed = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq)
            if self.window is not None:  # key j >= query i - left (megatron's window_size)
                allowed = allowed.triu(sk - sq - self.window[0])
        else:
            allowed = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
        if attention_mask is not None and not packed:
            allowed = allowed & ~attention_mask.to(torch.bool)  # -> [b, 1, sq, sk]
        # A query whose keys are all masked (padding) attends to itself instead of
        # producing NaN; its output is never used, but NaN would leak through 0 * NaN.
        if sq == sk:
            allowed = allowed | torch.eye(sq, dtype=torch.bool, device=q.device)

        if self.softmax_offset is not None:
            out = self._with_sinks(q, k, v, allowed)
        else:
            out = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=allowed,
                dropout_p=self.dropout_p if self.training else 0.0,
                scale=self.softmax_scale,
            )
        # [b, n, sq, hn] -> [sq, b, n * hn]
        out = out.permute(2, 0, 1, 3).reshape(sq, out.shape[0], -1)
        if packed:
            out = out.squeeze(1)
        return out


    def _with_sinks(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """Attention whose softmax also holds one sink logit per head (``softmax_offset``), dropped after it
        (HF ``GptOssAttention``'s eager path). q/k/v ``[b, n, s, hn]`` (KV heads repeated), ``allowed``
        broadcastable to ``[b, n, sq, sk]``; returns ``[b, n, sq, hn]``. Softmax in fp32."""
        scores = torch.matmul(q, k.transpose(-1, -2)).float() * self.softmax_scale
        scores = scores.masked_fill(~allowed, float("-inf"))
        sinks = self.softmax_offset.float().view(1, -1, 1, 1).expand(scores.shape[0], -1, scores.shape[2], 1)
        probs = torch.softmax(torch.cat([scores, sinks], dim=-1), dim=-1)[..., :-1].to(q.dtype)
        probs = F.dropout(probs, p=self.dropout_p, training=self.training)
        return torch.matmul(probs, v)


class MLACoreAttention(SDPACoreAttention):
    def __init__(self, *args, k_channels: Optional[int] = None, v_channels: Optional[int] = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if kwargs.get("softmax_scale") is None and k_channels:  # scale by the query/key head dim
            self.softmax_scale = 1.0 / math.sqrt(k_channels)
