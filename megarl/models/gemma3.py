"""Gemma 3 text models (HF ``Gemma3ForCausalLM``, ``model_type`` ``gemma3_text``) on megatron's local spec.

What Gemma 3 adds to a Llama-like decoder, and where megarl puts it:

* RMSNorm scaled by ``1 + weight`` (weights stored zero-centred), computed in fp32 as HF does:
  :class:`ZeroCenteredRMSNorm`, for every norm (input, pre-/post-attention, pre-/post-feedforward,
  q/k, final);
* sandwich norms: the attention output and the MLP output are normed before their residual add:
  :class:`Gemma3SelfAttention` / :class:`Gemma3MLP` (megatron's modules plus that norm);
* interleaved sliding-window (``layer_types`` ``sliding_attention``) and global layers: megatron's
  own ``window_size`` / ``window_attn_skip_freq``, honoured by :class:`megarl.models.core_attention.SDPACoreAttention`;
  local layers rotate with ``rope_parameters["sliding_attention"]`` (their own base, no scaling),
  global ones with GPTModel's rotary (``rope_parameters["full_attention"]``, linear scaling allowed);
* GeGLU MLP (``gelu_pytorch_tanh``), softmax scale ``query_pre_attn_scalar ** -0.5``, embeddings
  multiplied by ``sqrt(hidden_size)`` rounded to the model dtype (:func:`scale_embeddings`).

One difference from HF remains, in training only: HF's embedding has ``padding_idx = pad_token_id``, so
the pad token's row gets no gradient from its lookups; megatron's embedding has no such row (the pad token
only fills padding, whose outputs reach no loss, so in practice that row's gradient is the LM head's alone).
megatron's TransformerLayer logs "Unknown MLP type" once per layer for :class:`Gemma3MLP` and builds it
with the default TP group (the one it would pass).

Megatron-core (0.16.1, 0.19.2) has no Gemma model; mbridge 0.15.1's gemma3 bridge (a TransformerLayer subclass
with the two post norms, TE norms and a CUDA attention) was the reference for the structure.
"""

from __future__ import annotations

import copy
import functools
from typing import Any, Optional

import torch
import torch.nn.functional as F
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.transformer.attention import SelfAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.mlp import MLP
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.utils import is_layer_window_attention

__all__ = ["GEMMA3_MODEL_TYPES", "check_gemma3_supported", "gemma3_transformer_kwargs", "gemma3_rope_kwargs",
           "gemma3_layer_spec", "scale_embeddings", "ZeroCenteredRMSNorm"]

GEMMA3_MODEL_TYPES = ("gemma3_text",)
_LAYER_TYPES = ("sliding_attention", "full_attention")


def _rope(hf_config, layer_type: str) -> dict[str, Any]:
    return dict(hf_config.rope_parameters[layer_type])


def check_gemma3_supported(hf_config) -> None:
    """Refuse the Gemma 3 options megarl does not implement, naming the config.json field."""
    where = "(actor_rollout_ref.model.path config.json)"
    if hf_config.hidden_activation != "gelu_pytorch_tanh":
        raise ValueError(f"gemma3_text hidden_activation {hf_config.hidden_activation!r} {where} is not supported "
                         "(only gelu_pytorch_tanh)")
    for name in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(hf_config, name, None) is not None:
            raise ValueError(f"gemma3_text {name}={getattr(hf_config, name)} {where} is not supported; Gemma 3 "
                             "checkpoints set it to null")
    if getattr(hf_config, "use_bidirectional_attention", False):
        raise ValueError(f"gemma3_text use_bidirectional_attention=true {where} is not supported (causal LM only)")
    if getattr(hf_config, "attention_bias", False):
        raise ValueError(f"gemma3_text attention_bias=true {where} is not supported")
    unknown = sorted(set(hf_config.layer_types) - set(_LAYER_TYPES))
    if unknown:
        raise ValueError(f"gemma3_text layer_types {unknown} {where} are not supported; known: {_LAYER_TYPES}")
    local = _rope(hf_config, "sliding_attention")
    if local.get("rope_type", "default") != "default":
        raise ValueError(f"gemma3_text sliding-attention rope {local} {where} is not supported (default only)")
    full = _rope(hf_config, "full_attention")
    if full.get("rope_type", "default") not in ("default", "linear"):
        raise ValueError(f"gemma3_text full-attention rope {full} {where} is not supported (default or linear)")


def gemma3_transformer_kwargs(hf_config) -> dict[str, Any]:
    """TransformerConfig fields of a Gemma 3 text model (on top of megarl's Llama-like base)."""
    return dict(
        activation_func=functools.partial(F.gelu, approximate="tanh"),
        bias_activation_fusion=False,  # megatron fuses only exact gelu and swiglu
        qk_layernorm=True,
        softmax_scale=float(hf_config.query_pre_attn_scalar) ** -0.5,
        # HF: query i sees keys i - sliding_window + 1 .. i; megatron: (keys left of i, keys right of i)
        window_size=(int(hf_config.sliding_window) - 1, 0),
        window_attn_skip_freq=[int(t == "sliding_attention") for t in hf_config.layer_types],
    )


def gemma3_rope_kwargs(hf_config) -> dict[str, Any]:
    """GPTModel rotary arguments: the global layers' rope (the local layers build their own)."""
    full = _rope(hf_config, "full_attention")
    kwargs: dict[str, Any] = {"rotary_base": float(full["rope_theta"]), "rope_scaling": False}
    if full.get("rope_type", "default") == "linear":  # positions / factor, as megatron's interpolation
        kwargs["seq_len_interpolation_factor"] = float(full["factor"])
    return kwargs


class ZeroCenteredRMSNorm(torch.nn.Module):
    """Gemma's RMSNorm: ``x / rms(x) * (1 + weight)`` in fp32, cast back to ``x``'s dtype (HF
    ``Gemma3RMSNorm``, bit for bit). ``weight`` ``[hidden]`` holds HF's zero-centred values.

    Under sequence parallelism a rank's weight gradient comes from its sequence shard only, so the
    weight is marked ``sequence_parallel`` for megatron's ``finalize_model_grads`` to all-reduce it
    over the TP group (q/k norms megatron reduces by name).
    """

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-6, **_unused) -> None:
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.zeros(hidden_size, dtype=config.params_dtype))
        setattr(self.weight, "sequence_parallel", config.sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


class Gemma3SelfAttention(SelfAttention):
    """megatron's self-attention with Gemma 3's post-attention norm on its output, and on
    sliding-window layers its own rotary embedding (``local_rotary_base``, no scaling).

    Shapes as ``SelfAttention``: hidden ``[s, b, h]`` in and out (``[t, 1, h]`` packed).
    """

    def __init__(self, config: TransformerConfig, submodules, layer_number: int,
                 attn_mask_type: AttnMaskType = AttnMaskType.causal, cp_comm_type: Optional[str] = None,
                 pg_collection=None, *, local_rotary_base: float, **kwargs) -> None:
        super().__init__(config=config, submodules=submodules, layer_number=layer_number,
                         attn_mask_type=attn_mask_type, cp_comm_type=cp_comm_type, pg_collection=pg_collection,
                         **kwargs)
        self.post_attention_layernorm = ZeroCenteredRMSNorm(config, config.hidden_size, config.layernorm_epsilon)
        self.local_rotary = None
        if is_layer_window_attention(config.window_size, config.window_attn_skip_freq, self.layer_number):
            self.local_rotary = RotaryEmbedding(
                kv_channels=config.kv_channels, rotary_percent=1.0, rotary_interleaved=config.rotary_interleaved,
                rotary_base=local_rotary_base, use_cpu_initialization=config.use_cpu_initialization,
            )

    def forward(self, hidden_states, attention_mask, *args, rotary_pos_emb=None, packed_seq_params=None, **kwargs):
        if args:
            raise TypeError("Gemma3SelfAttention takes its arguments after attention_mask by keyword")
        if self.local_rotary is not None and rotary_pos_emb is not None:
            # rotary_pos_emb: [s, 1, 1, head_dim] from GPTModel (context parallelism is refused for Gemma 3)
            packed = packed_seq_params is not None and packed_seq_params.qkv_format == "thd"
            rotary_pos_emb = self.local_rotary(rotary_pos_emb.shape[0], packed_seq=packed)
        out, bias = super().forward(hidden_states, attention_mask, rotary_pos_emb=rotary_pos_emb,
                                    packed_seq_params=packed_seq_params, **kwargs)
        assert bias is None, "Gemma 3 attention has no output bias"
        return self.post_attention_layernorm(out), None


class Gemma3MLP(MLP):
    """megatron's (GeGLU) MLP with Gemma 3's post-feedforward norm on its output ``[s, b, h]``."""

    def __init__(self, config: TransformerConfig, submodules, **kwargs) -> None:
        super().__init__(config=config, submodules=submodules, **kwargs)
        self.post_feedforward_layernorm = ZeroCenteredRMSNorm(config, config.hidden_size, config.layernorm_epsilon)

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        out, bias = super().forward(hidden_states, *args, **kwargs)
        assert bias is None, "Gemma 3 MLP has no output bias"
        return self.post_feedforward_layernorm(out), None


def gemma3_layer_spec(config: TransformerConfig, hf_config) -> ModuleSpec:
    """The local layer spec with Gemma 3's norms, attention and MLP (see module docstring)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from megarl.models.core_attention import SDPACoreAttention

    spec = copy.deepcopy(get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm"))
    layer = spec.submodules
    attention = layer.self_attention
    attention.module = Gemma3SelfAttention
    attention.params = {**attention.params, "attn_mask_type": AttnMaskType.causal,
                        "local_rotary_base": float(_rope(hf_config, "sliding_attention")["rope_theta"])}
    attention.submodules.core_attention = SDPACoreAttention
    attention.submodules.q_layernorm = ZeroCenteredRMSNorm
    attention.submodules.k_layernorm = ZeroCenteredRMSNorm
    layer.input_layernorm = ZeroCenteredRMSNorm
    layer.pre_mlp_layernorm = ZeroCenteredRMSNorm
    # megatron-core 0.19's local spec gives the MLP as functools.partial(MLP.as_mlp_submodule, submodules=...)
    if not (isinstance(layer.mlp, functools.partial) and layer.mlp.func == MLP.as_mlp_submodule):
        raise TypeError(f"megatron's local layer spec has an unexpected MLP entry {layer.mlp!r}: revisit gemma3_layer_spec")
    layer.mlp = functools.partial(Gemma3MLP.as_mlp_submodule, *layer.mlp.args, **layer.mlp.keywords)
    return spec


def scale_embeddings(embedding: torch.nn.Module, hidden_size: int) -> None:
    """Forward hook on the word embedding: output ``[b, s, h]`` times ``sqrt(hidden_size)`` rounded
    to the output dtype first (HF ``Gemma3TextScaledWordEmbedding``)."""
    scale = torch.tensor(hidden_size**0.5)

    def hook(module, inputs, output):
        return output * scale.to(device=output.device, dtype=output.dtype)

    embedding.register_forward_hook(hook)
