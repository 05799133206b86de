"""NVIDIA Nemotron-H (HF ``NemotronHForCausalLM``, ``model_type`` ``nemotron_h``: Nemotron-3-Nano-30B-A3B) on
megatron's local spec, in megarl's GPTModel.

Its decoder has one block kind per layer (config.json ``layers_block_type``, or ``hybrid_override_pattern`` with
``M`` / ``*`` / ``-`` / ``E``), each ``x + mixer(RMSNorm(x))``:

* ``linear_attention`` (``M``): megatron-core's ``MambaMixer`` (Mamba-2: one input projection holding z, x, B, C
  and dt, a causal depthwise convolution over x/B/C, the chunked SSD scan, ``y * silu(z)``, a group RMSNorm, the
  output projection); its kernels are mamba-ssm's on CUDA, on CPU torch versions
  (:mod:`megarl.compat.megatron_core.mamba_torch`);
* ``full_attention`` (``*``): GQA attention without positional embedding (no rotary: ``position_embedding_type``
  ``none``) and without an MLP;
* ``mlp`` (``-``): a non-gated squared-ReLU MLP (``up_proj``, ``down_proj``) without attention;
* ``moe`` (``E``): DeepSeek-V3's routing (sigmoid scores, top-k of ``scores + e_score_correction_bias``,
  renormalised, scaled by ``routed_scaling_factor``: :mod:`megarl.models.moe_config`) over non-gated squared-ReLU
  experts, plus one non-gated shared expert of ``moe_shared_expert_intermediate_size``.

megatron-core builds this family as ``HybridModel`` (``HybridStack`` of ``MambaLayer`` / ``TransformerLayer`` /
``MLPLayer``) with transformer-engine's fused norm-linears only. megarl builds it as a GPTModel whose
``TransformerBlock`` takes one local ``TransformerLayer`` spec per layer, each with the parts it lacks as
``IdentityOp`` (as megatron's ``MLPLayer`` is): the MambaMixer sits where attention would
(:class:`MambaMixerInLayer` takes the attention's call), so megarl's GPTModel pipeline (packed thd forward with
per-sequence ``seq_idx``, the pipeline schedule, the LM-head hooks, the converters' names ``decoder.layers.{i}.``)
is the one every other family runs. megatron's MambaMixer takes no padding mask: rows must have their padding
after their tokens, or be packed (megarl's workers do both).

Where HF differs: it clamps the SSM step ``softplus(dt + dt_bias)`` below at ``time_step_min``; megatron-core's
MambaMixer and vLLM 0.32's MambaMixer2 (the rollout) pass the kernels no limit (``dt_limit`` (0, inf)). They agree
wherever the step is at least ``time_step_min`` (0.001 in the released config).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Optional

import torch
from megatron.core.ssm.mamba_mixer import MambaMixer
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig

__all__ = ["NEMOTRON_H_MODEL_TYPES", "MambaMixerInLayer", "check_nemotron_h_supported", "nemotron_h_block",
           "nemotron_h_layer_kinds", "nemotron_h_transformer_kwargs", "require_mamba_kernels"]

NEMOTRON_H_MODEL_TYPES = ("nemotron_h",)
_WHERE = "(actor_rollout_ref.model.path config.json)"
# config.json field -> the value megarl builds (what megatron's MambaMixer / the layer specs assume)
_FIXED = {
    "mamba_hidden_act": "silu",
    "mlp_hidden_act": "relu2",
    "use_conv_bias": True,
    "use_bias": False,
    "mamba_proj_bias": False,
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "sliding_window": None,
    "moe_latent_size": None,
    "num_nextn_predict_layers": 0,
}
# HF's mixer norm eps is layer_norm_epsilon; megatron's MambaMixer builds its gated norm with eps=1e-5
_MAMBA_NORM_EPS = 1e-5


def nemotron_h_layer_kinds(hf_config) -> list[str] | None:
    """Each layer's kind (``linear_attention`` / ``full_attention`` / ``mlp`` / ``moe``; :func:`megarl.config.rules.
    model.nemotron_h_layer_kinds` of the config's fields)."""
    from megarl.config.rules.model import nemotron_h_layer_kinds as kinds

    return kinds(vars(hf_config))


def check_nemotron_h_supported(hf_config) -> None:
    """Refuse the Nemotron-H options megarl does not build, naming the config.json field."""
    kinds = nemotron_h_layer_kinds(hf_config)
    if not kinds:
        raise ValueError(f"nemotron_h config.json has neither layers_block_type nor hybrid_override_pattern {_WHERE}")
    for field, value in _FIXED.items():
        got = getattr(hf_config, field, value)
        if got != value:
            raise ValueError(f"nemotron_h {field}={got!r} {_WHERE} is not supported (megarl builds {value!r})")
    eps = getattr(hf_config, "layer_norm_epsilon", _MAMBA_NORM_EPS)
    if "linear_attention" in kinds and eps != _MAMBA_NORM_EPS:
        raise ValueError(f"nemotron_h layer_norm_epsilon={eps} {_WHERE} is not supported with Mamba layers "
                         f"(megatron-core 0.19.2's MambaMixer normalises with eps {_MAMBA_NORM_EPS})")
    if "moe" not in kinds:
        raise ValueError(f"nemotron_h without MoE layers (no 'moe' / 'E' in the layer pattern) {_WHERE} is not "
                         "supported yet")


def nemotron_h_transformer_kwargs(hf_config) -> dict[str, Any]:
    """TransformerConfig fields of Nemotron-H (on top of megarl's Llama-like base, its norms' ``layer_norm_epsilon``
    and the MoE fields)."""
    from megatron.core.activations import squared_relu

    return dict(
        activation_func=squared_relu,
        gated_linear_unit=False,
        mamba_state_dim=int(hf_config.ssm_state_size),
        mamba_head_dim=int(hf_config.mamba_head_dim),
        mamba_num_groups=int(hf_config.n_groups),
        mamba_num_heads=int(hf_config.mamba_num_heads),
    )


def require_mamba_kernels(device: torch.device) -> None:
    """mamba-ssm's kernels on CUDA, the torch ones on CPU; ValueError naming the package on CUDA without it."""
    from megatron.core.ssm import mamba_mixer

    if device.type == "cpu":
        from megarl.compat.megatron_core.mamba_torch import use_torch_mamba_kernels

        use_torch_mamba_kernels()
    elif not mamba_mixer.HAVE_MAMBA_SSM:
        raise ValueError("Nemotron-H's Mamba layers need mamba-ssm's and causal-conv1d's kernels on CUDA "
                         "(pip install mamba-ssm causal-conv1d); they are not installed")


class MambaMixerInLayer(MambaMixer):
    """megatron's MambaMixer in a TransformerLayer's attention place: built with the attention's arguments, called
    with its keyword arguments (the mask and rotary unused). A packed batch's ``seq_idx`` (each token's sequence,
    what the Mamba kernels split by) is derived from its ``cu_seqlens`` when the caller gave none."""

    def __init__(self, config: TransformerConfig, submodules, layer_number: int, pg_collection=None,
                 pp_layer_offset: int = 0, name: Optional[str] = None, d_conv: int = 4, chunk_size: int = 128,
                 **_attention_only):
        super().__init__(config, submodules, d_model=config.hidden_size, d_conv=d_conv, chunk_size=chunk_size,
                         layer_number=layer_number, pg_collection=pg_collection, pp_layer_offset=pp_layer_offset,
                         name=name)

    def forward(self, hidden_states, attention_mask=None, inference_context=None, *, packed_seq_params=None,
                **_attention_only):
        """hidden_states ``[s, b, h]`` (``[s / tp, b, h]`` under sequence parallelism) -> ``(out, bias)``."""
        if packed_seq_params is not None and packed_seq_params.seq_idx is None:
            tokens = hidden_states.shape[0] * (self.pg_collection.tp.size() if self.config.sequence_parallel else 1)
            packed_seq_params = dataclasses.replace(packed_seq_params, total_tokens=tokens)
        return super().forward(hidden_states, inference_context, packed_seq_params=packed_seq_params)


def _without(spec: ModuleSpec, *, attention: bool = False, mlp: bool = False) -> ModuleSpec:
    """A local layer spec with its attention and / or MLP (and their norms) as identities."""
    from megatron.core.transformer.identity_op import IdentityFuncOp, IdentityOp

    spec = copy.deepcopy(spec)
    layer = spec.submodules
    if attention:
        layer.input_layernorm, layer.self_attention, layer.self_attn_bda = IdentityOp, IdentityOp, IdentityFuncOp
    if mlp:
        layer.pre_mlp_layernorm, layer.mlp, layer.mlp_bda = IdentityOp, IdentityOp, IdentityFuncOp
    return spec


def _layer_specs(config: TransformerConfig, hf_config) -> dict[str, ModuleSpec]:
    from megatron.core.ssm.mamba_mixer import MambaMixerSubmodules
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    from megarl.models.spec import get_layer_spec

    dense = get_layer_spec(config, use_te=False, num_experts=None)
    mamba = _without(dense, mlp=True)
    mamba.submodules.self_attention = ModuleSpec(
        module=MambaMixerInLayer,
        params={"d_conv": int(hf_config.conv_kernel), "chunk_size": int(hf_config.chunk_size)},
        submodules=MambaMixerSubmodules(in_proj=ColumnParallelLinear, out_proj=RowParallelLinear),
    )
    return {
        "linear_attention": mamba,
        "full_attention": _without(dense, mlp=True),
        "mlp": _without(dense, attention=True),
        "moe": _without(get_layer_spec(config, use_te=False, num_experts=config.num_moe_experts), attention=True),
    }


def nemotron_h_block(config: TransformerConfig, vp_stage: Optional[int], hf_config):
    """The decoder block of one (virtual) pipeline stage: each layer's spec by its kind."""
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    from megarl.models.spec import SequenceParallelTorchNorm, stage_layers

    kinds = nemotron_h_layer_kinds(hf_config)
    specs = _layer_specs(config, hf_config)
    return TransformerBlockSubmodules(layer_specs=[specs[kinds[layer]] for layer in stage_layers(config, vp_stage)],
                                      layer_norm=SequenceParallelTorchNorm)
