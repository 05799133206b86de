"""Core attention of the local multi-latent-attention (MLA) layer spec.

megatron's ``MLASelfAttention`` builds its core attention with ``k_channels`` / ``v_channels``
(query/key head dim ``qk_head_dim + qk_pos_emb_head_dim`` differs from the value head dim) and an
explicit ``softmax_scale``; :class:`~megarl.models.spec.SDPACoreAttention` already handles a value
head dim that differs from the query's (``scaled_dot_product_attention`` does), so this only
takes those arguments. Shapes: query/key ``[s, b, np, qk_head_dim + qk_pos_emb_head_dim]``, value
``[s, b, np, v_head_dim]``, output ``[s, b, np * v_head_dim]``.
"""

from __future__ import annotations

import math
from typing import Optional

from megarl.models.spec import SDPACoreAttention

__all__ = ["MLACoreAttention"]


class MLACoreAttention(SDPACoreAttention):
    def __init__(self, *args, k_channels: Optional[int] = None, v_channels: Optional[int] = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if kwargs.get("softmax_scale") is None and k_channels:  # scale by the query/key head dim
            self.softmax_scale = 1.0 / math.sqrt(k_channels)
