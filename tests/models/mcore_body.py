"""Rank bodies for the multi-process megatron tests (spawned by dist_utils.run_distributed)."""

from __future__ import annotations

import torch
import transformers


def megatron_forward(chunks, input_ids, attention_mask, position_ids, *, value_head=False,
                     backward=False):
    """Pass through megatron's pipeline schedule, 2 micro-batches.

    Returns on the last pipeline stage: per-token log-probs of the next token
    ``[b, s-1]`` (actor) or values ``[b, s]`` (critic); None on other stages. With
    ``backward``, also back-propagates ``-sum(valid log-probs) / 2`` (the schedule divides
    each micro-batch loss by the number of micro-batches) into the parameters' ``.grad``.
    """
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    from megarl.models import attention_mask_for_megatron

    labels = torch.roll(input_ids, shifts=-1, dims=1)
    micro = [
        dict(input_ids=i, position_ids=p, mask=attention_mask_for_megatron(m), labels=l,
             valid=(m[:, :-1] * m[:, 1:]).float())
        for i, p, m, l in zip(
            input_ids.chunk(2), position_ids.chunk(2), attention_mask.chunk(2), labels.chunk(2)
        )
    ]

    def forward_step(data_iterator, model):
        batch = next(data_iterator)
        output = model(batch["input_ids"], batch["position_ids"], batch["mask"])

        def loss_func(out):
            if value_head:
                result = out[..., 0]
            else:  # out: [b, s, V_pad / tp], this rank's vocab shard
                result = -vocab_parallel_cross_entropy(out.float().transpose(0, 1).contiguous(),
                                                        batch["labels"].transpose(0, 1).contiguous())
                result = result.transpose(0, 1)[:, :-1]
            loss = -(result * batch["valid"]).sum() if backward and not value_head else torch.zeros(())
            return loss, {"result": result.detach()}

        return output, loss_func

    iterators = [iter(micro) for _ in chunks] if len(chunks) > 1 else iter(micro)
    outputs = get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iterators,
        model=chunks,
        num_microbatches=2,
        seq_length=input_ids.shape[1],
        micro_batch_size=input_ids.shape[0] // 2,
        forward_only=not backward,
    )
    if not parallel_state.is_pipeline_last_stage():
        return None
    return torch.cat([o["result"] for o in outputs])


def _to(value, device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    return value


def convert_and_forward(megatron_cfg: dict, cases: list[dict], device: str = "cpu") -> list[dict]:
    """For each case: build, load HF, forward the batch, export; results per case.

    A case: ``hf_dir``, ``batch`` (input_ids, attention_mask, position_ids),
    optional ``value_head``, ``packed`` (also run the thd-packed forward, PP=1 only).
    Returns per case ``result`` (last stage), ``packed`` and ``export``
    (``{hf_name: tensor}``, exported on every rank).
    """
    from megarl.models import build_model, export_hf_weights, load_hf_weights
    from megarl.parallel import init_distributed

    init_distributed(megatron_cfg, device, seed=42)
    if device == "cuda":  # exact fp32 matmuls for the comparison with HF on CPU
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    out = []
    for case in cases:
        case = _to(case, device)
        hf_config = transformers.AutoConfig.from_pretrained(case["hf_dir"])
        value_head = case.get("value_head", False)
        chunks = build_model(hf_config, megatron_cfg, value_head=value_head, device=device,
                             dtype=torch.float32)
        load_hf_weights(chunks, case["hf_dir"])
        for chunk in chunks:
            chunk.eval()
        with torch.no_grad():
            result = megatron_forward(chunks, *case["batch"], value_head=value_head)
            packed = None
            if case.get("packed") and len(chunks) == 1:
                packed = packed_log_probs(chunks[0], case["batch"][0], case["batch"][1])
        exported = {name: t.clone() for name, t in export_hf_weights(chunks, hf_config)}
        grads = None
        if case.get("grad"):
            grads = hf_layout_grads(chunks, hf_config, case["batch"])
        experts = sorted({type(m).__name__ for n, m in chunks[0].named_modules() if n.endswith("mlp.experts")})
        out.append(_to({"result": result, "packed": packed, "export": exported, "grads": grads,
                        "experts": experts}, "cpu"))
    return out


def hf_layout_grads(chunks, hf_config, batch) -> dict:
    """Backward through the schedule; the gradients exported in HF names and layout.

    (Overwrites the parameters with their gradients to reuse the exporter.)
    """
    from megarl.models import export_hf_weights

    for chunk in chunks:
        chunk.zero_grad(set_to_none=True)
    megatron_forward(chunks, *batch, backward=True)
    # What megatron's finalize_model_grads does for these under DDP: each TP rank saw only
    # its heads, so replicated QK-norm weights need their gradients summed over TP.
    from megatron.core import parallel_state

    tp_group = parallel_state.get_tensor_model_parallel_group()
    for chunk in chunks:
        for name, param in chunk.named_parameters():
            if ("q_layernorm" in name or "k_layernorm" in name) and param.grad is not None:
                torch.distributed.all_reduce(param.grad, group=tp_group)
    # Tied embeddings at PP > 1: the first stage's embedding and the last stage's copy
    # sum their gradients over the embedding group (finalize_model_grads does it too).
    if parallel_state.get_pipeline_model_parallel_world_size() > 1:
        for chunk in chunks:
            if chunk.share_embeddings_and_output_weights and (chunk.pre_process or chunk.post_process):
                weight = chunk.shared_embedding_or_output_weight()
                torch.distributed.all_reduce(weight.grad, group=parallel_state.get_embedding_group())
    with torch.no_grad():
        for chunk in chunks:
            for param in chunk.parameters():
                param.copy_(param.grad if param.grad is not None else torch.zeros_like(param))
    return {name: t.clone() for name, t in export_hf_weights(chunks, hf_config)}


def critic_save_and_config(megatron_cfg: dict, critic_dir: str, actor_dir: str, out_dir: str, batch) -> dict:
    """Critic forward + export, actor save_hf_checkpoint, and config override checks."""
    from megarl.models import build_model, export_hf_weights, load_hf_weights, save_hf_checkpoint
    from megarl.models.config import hf_to_transformer_config
    from megarl.parallel import init_distributed

    init_distributed(megatron_cfg, "cpu", seed=42)
    hf_config = transformers.AutoConfig.from_pretrained(critic_dir)
    critic = build_model(hf_config, megatron_cfg, value_head=True, device="cpu")
    load_hf_weights(critic, critic_dir)
    for chunk in critic:
        chunk.eval()
    with torch.no_grad():
        values = megatron_forward(critic, *batch, value_head=True)
    exported = {name: t.clone() for name, t in export_hf_weights(critic, hf_config)}

    actor_config = transformers.AutoConfig.from_pretrained(actor_dir)
    actor = build_model(actor_config, megatron_cfg, device="cpu")
    load_hf_weights(actor, actor_dir)
    save_hf_checkpoint(actor, actor_config, out_dir, tokenizer_dir=actor_dir)

    override = hf_to_transformer_config(
        hf_config, {"override_transformer_config": {"hidden_dropout": 0.25}}, device="cpu",
        dtype=torch.float32,
    )
    try:
        hf_to_transformer_config(
            hf_config, {"override_transformer_config": {"no_such_field": 1}}, device="cpu",
            dtype=torch.float32,
        )
        unknown_error = None
    except ValueError as exc:
        unknown_error = str(exc)
    return {
        "values": values,
        "export": exported,
        "hidden_dropout": override.hidden_dropout,
        "unknown_error": unknown_error,
    }


def packed_log_probs(chunk, input_ids, attention_mask):
    """Single-chunk forward of the valid tokens packed as thd ``[1, T]``; log-probs ``[b, s-1]``.

    Rows' valid tokens are concatenated, positions restart at 0 per row; padded
    positions of the result are 0.
    """
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    lengths = attention_mask.sum(-1)
    tokens = input_ids[attention_mask.bool()][None]  # [1, T]
    device = input_ids.device
    positions = torch.cat([torch.arange(int(n), device=device) for n in lengths])[None]
    cu = torch.cat([torch.zeros(1, dtype=torch.int32, device=device),
                    lengths.cumsum(0).to(torch.int32)])
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                             max_seqlen_q=int(lengths.max()), max_seqlen_kv=int(lengths.max()))
    logits = chunk(tokens, positions, None, packed_seq_params=params)  # [1, T, V/tp]
    labels = torch.roll(tokens, -1, dims=1)
    logp = -vocab_parallel_cross_entropy(logits.float().transpose(0, 1).contiguous(),
                                         labels.transpose(0, 1).contiguous())[:, 0]  # [T]
    # Row r's valid span is cu[r]:cu[r+1]; its last token has no next token.
    result = torch.zeros(input_ids.shape[0], input_ids.shape[1] - 1, device=device)
    for row in range(input_ids.shape[0]):
        idx = attention_mask[row].nonzero()[:, 0]
        result[row, idx[:-1]] = logp[int(cu[row]): int(cu[row + 1]) - 1]
    return result


def aux_loss_grads(megatron_cfg: dict, hf_dirs: list[str], input_ids: torch.Tensor) -> list[dict]:
    """Per model: gradients of megatron's router load-balancing loss alone, in HF names and layout.

    One forward of the whole (unpadded) batch ``[b, s]`` in training mode outside the pipeline
    schedule, the aux-loss gradient scale set to 1 (the schedule sets 1 / micro-batches), and a
    backward of ``0 * logits``: only the routers' load-balancing terms reach the gradients.
    """
    from megatron.core.transformer.moe.router import MoEAuxLossAutoScaler

    from megarl.models import build_model, export_hf_weights, load_hf_weights
    from megarl.parallel import init_distributed

    init_distributed(megatron_cfg, "cpu", seed=42)
    out = []
    for hf_dir in hf_dirs:
        hf_config = transformers.AutoConfig.from_pretrained(hf_dir)
        chunks = build_model(hf_config, megatron_cfg, device="cpu", dtype=torch.float32)
        load_hf_weights(chunks, hf_dir)
        model = chunks[0]
        model.train()
        MoEAuxLossAutoScaler.set_loss_scale(torch.ones(1))
        positions = torch.arange(input_ids.shape[1])[None].expand_as(input_ids)
        logits = model(input_ids, positions, None)
        (0.0 * logits.sum()).backward()
        with torch.no_grad():
            for param in model.parameters():
                param.copy_(param.grad if param.grad is not None else torch.zeros_like(param))
        out.append({
            "load_balancing_type": model.config.moe_router_load_balancing_type,
            "grads": {name: t.clone() for name, t in export_hf_weights(chunks, hf_config)},
        })
    return out


def export_in_dtype(model_dir: str, out_dir: str, dtype: str) -> dict:
    """save_hf_checkpoint of a model built in ``dtype`` (its config.json may say another); the umask 022."""
    import os

    from megarl.models import build_model, load_hf_weights, save_hf_checkpoint
    from megarl.parallel import init_distributed

    os.umask(0o022)
    init_distributed({}, "cpu", seed=42)
    hf_config = transformers.AutoConfig.from_pretrained(model_dir)
    chunks = build_model(hf_config, {}, device="cpu", dtype=getattr(torch, dtype))
    load_hf_weights(chunks, model_dir)
    save_hf_checkpoint(chunks, hf_config, out_dir, tokenizer_dir=model_dir)
    return {"config_dtype_after": str(hf_config.dtype)}
