"""Rank bodies of the transformer-engine spec tests (one CUDA process, spawned by
dist_utils.run_distributed): actor log-probs and one update per layer spec and layout."""

from __future__ import annotations

import torch
import transformers

PROMPT_LEN, RESPONSE_LEN, VOCAB, PAD_ID = 40, 24, 300, 7
TEMPERATURE = 0.7


def make_model(out_dir: str, name: str = "qwen2", seed: int = 0) -> str:
    """Random Qwen2 / Qwen3 (head_dim 64, GQA 4:2, 2 layers) saved as fp32 safetensors."""
    from helpers.tiny import make_tiny_model

    return make_tiny_model(out_dir, name, vocab_size=VOCAB, num_layers=2, hidden_size=256, intermediate_size=512,
                           max_positions=256, head_dim=64 if name == "qwen3" else None, seed=seed)


def grpo_batch(rows: int = 12, seed: int = 1) -> dict[str, torch.Tensor]:
    """Left-padded prompts + right-padded responses (pad id PAD_ID, not 0), GRPO tensors.
    Row 0 has a one-token prompt, row 1 a full prompt and a one-token response."""
    g = torch.Generator().manual_seed(seed)
    p_lens = torch.randint(1, PROMPT_LEN + 1, (rows,), generator=g)
    r_lens = torch.randint(1, RESPONSE_LEN + 1, (rows,), generator=g)
    p_lens[0], p_lens[1], r_lens[1], r_lens[2] = 1, PROMPT_LEN, 1, RESPONSE_LEN
    p_mask = (torch.arange(PROMPT_LEN) >= PROMPT_LEN - p_lens[:, None]).long()
    r_mask = (torch.arange(RESPONSE_LEN) < r_lens[:, None]).long()
    mask = torch.cat([p_mask, r_mask], 1)
    ids = torch.randint(0, VOCAB, mask.shape, generator=g)
    ids = torch.where(mask.bool(), ids, torch.full_like(ids, PAD_ID))
    return {
        "input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        "responses": ids[:, PROMPT_LEN:].contiguous(), "response_mask": r_mask,
        "advantages": torch.randn(rows, RESPONSE_LEN, generator=g) * r_mask,
        "old_log_probs": (-torch.rand(rows, RESPONSE_LEN, generator=g) * 3 - 3) * r_mask,
    }


def hf_log_probs(model_dir: str, batch: dict, use_mask: bool = True) -> torch.Tensor:
    """HF transformers fp32 (eager attention) log-probs of the responses at TEMPERATURE `[B, R]`."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                       attention_mask=batch["attention_mask"] if use_mask else None).logits.double()
    logp = torch.log_softmax(logits[:, PROMPT_LEN - 1 : -1] / TEMPERATURE, -1)
    logp = logp.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    return (logp * batch["response_mask"]).float()


def actor_config(model_path: str, impl: str, packed: bool, rows: int, dtype: str = "bfloat16"):
    """The tiny worker tests' `actor_rollout_ref` config in `dtype`, with layer spec `impl`
    (`override_transformer_config.transformer_impl`, the ref's too) and layout `packed`
    (`model.use_remove_padding`); `impl` "transformer_engine:unfused" turns TE's fused RoPE and
    weight-gradient accumulation off."""
    from helpers.tiny import actor_rollout_ref_config, megatron_node

    spec, _, unfused = impl.partition(":")
    # auto: TE picks its kernels (verl's default `flash` needs flash-attn, absent on the GPU machine)
    overrides = {"transformer_impl": spec, "attention_backend": "auto",
                 **({"apply_rope_fusion": False, "gradient_accumulation_fusion": False} if unfused else {})}
    megatron = megatron_node(dtype=dtype, use_distributed_optimizer=False,  # SGD: Megatron shards only Adam
                             override_transformer_config=overrides)
    return actor_rollout_ref_config(
        model_path, megatron, {"model.use_remove_padding": packed, "rollout.temperature": TEMPERATURE},
        ppo_mini_batch_size=rows, ppo_micro_batch_size_per_gpu=rows // 2, entropy_coeff=0.0, use_kl_loss=False,
    )


def actor_runs(
    model_dir: str, batch: dict, variants: list[tuple[str, bool]], device: str = "cuda", dtype: str = "bfloat16",
) -> dict:
    """Per (transformer_impl, packed): the spec built, the parameter names, the HF names whose
    export differs from the checkpoint (or is missing / extra), log-probs of the responses,
    and after one update_policy (two micro-batches) the grad norm, the parameters whose gradient
    is not finite, every gradient (`main_grad`, fp32) and which TE kernel fusions ran."""
    from megarl.models import unwrap_chunk
    from megarl.protocol import DataProto
    from megarl.workers.actor import ActorWorker

    from safetensors.torch import load_file

    checkpoint = load_file(f"{model_dir}/model.safetensors")
    rows = batch["input_ids"].shape[0]
    results = {}
    for impl, packed in variants:
        worker = ActorWorker(actor_config(model_dir, impl, packed, rows, dtype), role="actor", device=device)
        worker.init_model()
        exported = {n: t.detach().to("cpu", copy=True) for n, t in worker.export_hf_weights()}
        data = DataProto.from_dict(dict(batch), meta_info={"temperature": TEMPERATURE, "nan_policy": "stop"})
        log_probs = worker.compute_log_prob(data).batch["old_log_probs"].cpu()
        metrics = worker.update_policy(data)
        model = unwrap_chunk(worker.engine.chunks[0])
        bad = [n for n, p in model.named_parameters()
               if getattr(p, "main_grad", None) is not None and not torch.isfinite(p.main_grad).all()]
        results[(impl, packed)] = {
            "built": worker.engine.transformer_impl,
            "rope_fusion": bool(model.config.apply_rope_fusion),
            "wgrad_fused_modules": sum(bool(getattr(m, "fuse_wgrad_accumulation", False)) for m in model.modules()),
            "main_grads": {n: p.main_grad.detach().float().cpu().clone() for n, p in model.named_parameters()
                           if getattr(p, "main_grad", None) is not None},
            "param_names": sorted(n for n, _ in model.named_parameters()),
            "log_probs": log_probs,
            "grad_norm": float(metrics["actor/grad_norm"][0] if isinstance(metrics["actor/grad_norm"], list)
                               else metrics["actor/grad_norm"]),
            "nonfinite_grads": bad,
            "export_mismatch": sorted(
                set(checkpoint) ^ set(exported)
                | {n for n in set(checkpoint) & set(exported)
                   if not torch.equal(exported[n], checkpoint[n].to(exported[n].dtype))}
            ),
        }
        del worker
        if device == "cuda":
            torch.cuda.empty_cache()
    return results


def lora_te_vs_local(model_dir: str, batch: dict) -> dict:
    """LoRA (rank 4, alpha 8) on the TE spec and on the local spec, fp32 with TF32 off, one GPU. Per spec: the
    spec built, the adapted layers, the responses' log-probs ``[rows, response]`` with every adapter's B set
    nonzero (seeded by the adapter's name, the same in both builds) as ``lora``, with the adapters merged into
    the base weights (``merged``) and with them off (``base``), then each adapter's gradient after one
    update_policy."""
    from megarl.models import unwrap_chunk
    from megarl.models.lora import adapters, adapters_disabled, merged_weights
    from megarl.protocol import DataProto
    from megarl.workers.actor import ActorWorker

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rows = batch["input_ids"].shape[0]
    out = {}
    for impl in ("transformer_engine", "local"):
        cfg = actor_config(model_dir, impl, False, rows, dtype="float32")
        cfg.model.lora.rank, cfg.model.lora.alpha = 4, 8.0
        worker = ActorWorker(cfg, role="actor", device="cuda")
        worker.init_model()
        chunks = worker.engine.chunks
        pairs = adapters(chunks)
        with torch.no_grad():  # what training does to B (it starts at zero)
            for _, adapter in pairs:
                gen = torch.Generator().manual_seed(sum(adapter.name.encode()))
                adapter.B.copy_(torch.randn(adapter.B.shape, generator=gen) * 0.05)
        data = DataProto.from_dict(dict(batch), meta_info={"temperature": TEMPERATURE, "nan_policy": "stop"})

        def log_probs() -> torch.Tensor:
            return worker.compute_log_prob(data).batch["old_log_probs"].cpu()

        lora = log_probs()
        with merged_weights(chunks):
            merged = log_probs()
        with adapters_disabled(chunks):
            base = log_probs()
        worker.update_policy(data)
        model = unwrap_chunk(chunks[0])
        out[impl] = {
            "built": worker.engine.transformer_impl,
            "experts": sorted({type(m).__name__ for n, m in model.named_modules() if n.endswith("mlp.experts")}),
            "adapted": sorted(adapter.name for _, adapter in pairs),
            "fused_norm_adapted": sorted(adapter.name for base_linear, adapter in pairs
                                         if type(base_linear).__name__ == "TELayerNormColumnParallelLinear"),
            "lora": lora, "merged": merged, "base": base,
            "grads": {f"{adapter.name}.{k}": getattr(adapter, k).main_grad.detach().float().cpu().clone()
                      for _, adapter in pairs for k in ("A", "B")},
        }
        del worker
        torch.cuda.empty_cache()
    return out
