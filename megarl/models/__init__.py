"""Megatron-Core GPT models built from HF configs, and HF weight conversion.

Forward contract of every chunk ``m`` returned by :func:`build_model` (a megatron
``GPTModel``)::

    out = m(input_ids,            # [b, s] int64 (first pipeline chunk; else None and
                                  #   the chunk takes its input via set_input_tensor)
            position_ids,         # [b, s] int64, e.g. (cumsum(attention_mask) - 1).clamp(min=0)
            attention_mask)       # [b, 1, 1, s] or [b, 1, s, s] bool, True = masked OUT
                                  #   (see attention_mask_for_megatron); causal is implied.
                                  #   The transformer-engine spec IGNORES it (megatron's
                                  #   `causal` mask type): give it rows whose padding comes
                                  #   after their tokens, and None (megarl's workers do)

    last chunk, actor:   out = logits [b, s, V_pad / tp] (this TP rank's vocab shard,
                         fp32/bf16); columns >= hf vocab_size hold a large negative value
    last chunk, critic:  out = values [b, s, 1]
    other chunks:        out = hidden states [s, b, h]
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel

from megarl.models.config import LOCAL_SPEC_ONLY, gpt_model_kwargs, hf_to_transformer_config
from megarl.models.gemma3 import GEMMA3_MODEL_TYPES, ZeroCenteredRMSNorm, gemma3_layer_spec, scale_embeddings
from megarl.models.nemotron_h import NEMOTRON_H_MODEL_TYPES, nemotron_h_block, require_mamba_kernels
from megarl.models.qwen_hybrid import QWEN_HYBRID_MODEL_TYPES, qwen_hybrid_block, require_gdn_kernels
from megarl.models.spec import (
    get_layer_spec,
    have_transformer_engine,
    local_block,
    moe_pattern,
    resolve_transformer_impl,
    te_block,
)
from megarl.models.value_head import ValueHead
from megarl.compat.transformer_engine import apex_wgrad_kernel_available
from megarl.models.weights import export_hf_weights, load_hf_weights, save_hf_checkpoint, save_hf_config, unwrap_chunk

__all__ = [
    "build_model",
    "load_hf_weights",
    "export_hf_weights",
    "save_hf_checkpoint",
    "save_hf_config",
    "attention_mask_for_megatron",
    "unwrap_chunk",
]

logger = logging.getLogger(__name__)


def attention_mask_for_megatron(attention_mask: torch.Tensor) -> torch.Tensor:
    """HF padding mask ``[b, s]`` (1 = token) -> megatron mask ``[b, 1, 1, s]`` (True = masked).

    The causal part is added by the core attention; pass the result as the chunk's
    ``attention_mask`` argument.
    """
    return (attention_mask == 0)[:, None, None, :]


def _mask_padded_vocab(vocab_size: int):
    """Forward hook on the LM head: logits of padded vocab rows -> finfo.min / 2.

    Megatron needs the vocab divisible by TP; the padding rows must never get
    probability mass. Half of finfo.min keeps ``logits - max`` finite (no inf/NaN in
    log-softmax or entropy). Written in place on the (few) padded columns of the TP
    ranks that have any, outside autograd: the incoming gradient of those columns is
    exactly 0 (their probability is exp(finfo.min / 2 - max) = 0), so no full copy of
    the ``[tokens, vocab / tp]`` logits is made, forward or backward.
    """

    def hook(module, inputs, output):
        logits, bias = output
        local = logits.shape[-1]
        tp_rank = parallel_state.get_tensor_model_parallel_rank()
        full = local * parallel_state.get_tensor_model_parallel_world_size()
        start = 0 if local == full else tp_rank * local  # gathered output starts at 0
        if start + local > vocab_size:
            with torch.no_grad():
                logits.detach()[..., max(0, vocab_size - start) :].fill_(torch.finfo(logits.dtype).min / 2)
        return logits, bias

    return hook


def _batch_major_lm_head(module, args):
    """Pre-hook of the LM head: hidden ``[s, b, h]`` -> ``[b, s, h]`` (a small copy), so
    the logits come out ``[b, s, V/tp]`` contiguous (see :func:`_seq_major_view`)."""
    return (args[0].transpose(0, 1).contiguous(), *args[1:])


def _seq_major_view(module, inputs, output):
    """Forward hook (after :func:`_batch_major_lm_head`): hand GPTModel the ``[s, b, V/tp]``
    view it expects. Its ``logits.transpose(0, 1).contiguous()`` is then free, and the
    gradient reaches the LM head contiguous: no copies of the logits (2.5 GB at 16k
    tokens x 76k vocab / tp in bf16) in forward or backward."""
    logits, bias = output
    return logits.transpose(0, 1), bias


def _block_spec(layer_spec, config, vp_stage, use_te: bool, hf_config):
    """What GPTModel takes as ``transformer_layer_spec`` for one chunk."""
    model_type = hf_config.model_type
    gemma3 = model_type in GEMMA3_MODEL_TYPES
    if model_type in QWEN_HYBRID_MODEL_TYPES:
        return qwen_hybrid_block(config, vp_stage)
    if model_type in NEMOTRON_H_MODEL_TYPES:
        return nemotron_h_block(config, vp_stage, hf_config)
    if not use_te:
        return local_block(layer_spec, config, vp_stage, final_norm=ZeroCenteredRMSNorm if gemma3 else None)
    return layer_spec if moe_pattern(config) is None else te_block(config, vp_stage)


def build_model(
    hf_config,
    megatron_cfg: Mapping[str, Any] | None,
    *,
    value_head: bool = False,
    device: str | torch.device,
    dtype: torch.dtype | None = None,
) -> list[torch.nn.Module]:
    """This rank's GPTModel chunks (one per virtual pipeline stage), randomly initialised.

    Needs ``megarl.parallel.init_distributed`` first. ``pre_process``/``post_process`` of
    each chunk come from parallel_state (first/last virtual stage). Load weights with
    :func:`load_hf_weights`.

    Args:
        hf_config: transformers ``PretrainedConfig`` (``megarl.models.config.SUPPORTED_MODEL_TYPES``).
        megatron_cfg: verl-style ``megatron`` node (``sequence_parallel``,
            ``override_transformer_config``; sizes come from parallel_state).
        value_head: critic: the last chunk's output layer maps hidden -> 1 value per token
            (``[b, s, 1]``), never tied to the embedding.
        device: ``"cpu"`` or ``"cuda"``. The layer spec follows
            ``TransformerConfig.transformer_impl`` (``override_transformer_config``;
            see :mod:`megarl.models.spec`); ``megarl_meta["transformer_impl"]`` of each
            chunk records the one used.
        dtype: parameter dtype; default float32 on CPU, bfloat16 on CUDA.
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if dtype is None:
        dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    config = hf_to_transformer_config(hf_config, megatron_cfg, device=device, dtype=dtype)
    impl, why = resolve_transformer_impl(config.transformer_impl, device, have_transformer_engine())
    gemma3 = hf_config.model_type in GEMMA3_MODEL_TYPES
    if hf_config.model_type in LOCAL_SPEC_ONLY and impl != "local":
        impl, why = "local", LOCAL_SPEC_ONLY[hf_config.model_type]
    if hf_config.model_type in QWEN_HYBRID_MODEL_TYPES:
        require_gdn_kernels(device)
    if hf_config.model_type in NEMOTRON_H_MODEL_TYPES:
        require_mamba_kernels(device)
    if why and device.type == "cuda":
        logger.warning("layer spec local instead of %s: %s", config.transformer_impl, why)
    config.transformer_impl = impl
    use_te = impl == "transformer_engine"
    wgrad_fusion = config.gradient_accumulation_fusion
    if wgrad_fusion and not apex_wgrad_kernel_available():
        if not use_te:
            raise ValueError(
                "megatron.override_transformer_config.gradient_accumulation_fusion=true needs transformer-engine's "
                f"layer spec (this model builds the {impl} spec) or apex's fused_weight_gradient_mlp_cuda; set it "
                "to false")
        # megatron's own linears (the LM head) would need apex; TE's are fused once DDP gives them
        # main_grad (MegatronEngine; megarl_meta["wgrad_fusion"] says so)
        config.gradient_accumulation_fusion = False
    if gemma3:
        spec = gemma3_layer_spec(config, hf_config)
    elif hf_config.model_type in (*QWEN_HYBRID_MODEL_TYPES, *NEMOTRON_H_MODEL_TYPES):
        spec = None  # per layer: qwen_hybrid_block / nemotron_h_block
    else:
        spec = get_layer_spec(config, use_te=use_te, num_experts=config.num_moe_experts)
    model_kwargs = gpt_model_kwargs(hf_config, value_head=value_head)
    vpp = parallel_state.get_virtual_pipeline_model_parallel_world_size()
    chunks: list[torch.nn.Module] = []
    for vp_stage in range(vpp or 1):
        stage = vp_stage if vpp is not None else None
        pre_process = parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage)
        post_process = parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage)
        model = GPTModel(
            config=config,
            transformer_layer_spec=_block_spec(spec, config, stage, use_te, hf_config),
            pre_process=pre_process,
            post_process=post_process,
            parallel_output=True,
            vp_stage=stage,
            **model_kwargs,
        )
        if pre_process and gemma3:
            scale_embeddings(model.embedding.word_embeddings, hf_config.hidden_size)
        if post_process and value_head:
            model.output_layer = ValueHead(config)
        elif post_process:
            if model_kwargs["vocab_size"] != hf_config.vocab_size:
                model.output_layer.register_forward_hook(_mask_padded_vocab(hf_config.vocab_size))
            if not config.sequence_parallel:  # with SP the LM head gathers hidden along dim 0
                model.output_layer.register_forward_pre_hook(_batch_major_lm_head)
                model.output_layer.register_forward_hook(_seq_major_view)
        model.megarl_meta = {"hf_config": hf_config, "value_head": value_head, "transformer_impl": impl,
                             "wgrad_fusion": wgrad_fusion}
        chunks.append(model.to(device))
    return chunks
