"""megarl's actor update path for the throughput benchmark: ActorWorker.update_policy.

Builds a random HF checkpoint of the benchmark shape (rank 0 writes it, every rank
loads its shard through megarl.models.load_hf_weights), an `actor_rollout_ref` config
with verl key names, and a DataProto of full-length sequences holding exactly the
benchmark's tokens (no padding), split into the same micro-batches.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def write_random_hf_dir(shape: dict, path: str, seed: int = 0) -> str:
    """Random-init Qwen2 of `shape` saved as bf16 safetensors at `path` (global rank 0),
    then a barrier. Initialised on the GPU when there is one (seconds for 1.5B)."""
    import transformers

    from _common import hf_config

    if dist.get_rank() == 0 and not os.path.exists(os.path.join(path, "config.json")):
        cfg = hf_config(shape)
        torch.manual_seed(seed)
        init_device = "cuda" if torch.cuda.is_available() else "cpu"
        with torch.device(init_device):
            model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        model.save_pretrained(path, safe_serialization=True)
        del model
    dist.barrier()
    return path


def actor_config(
    model_path: str, tp: int, micro_bs: int, n_micro: int, remove_padding: bool, dist_opt: bool,
    impl: str = "local", overrides: dict | None = None, optimizer: str = "adam", cp: int = 1, sp: bool = False,
):
    """The resolved `actor_rollout_ref` node of a real run's config (verl's defaults, as
    `python -m megarl.main_ppo` composes it): one mini-batch of micro_bs*n_micro rows per
    step, vanilla PPO loss, no KL, constant lr. ``impl`` is megatron's ``transformer_impl``
    (layer spec); ``overrides`` further TransformerConfig fields; ``optimizer`` "sgd": no
    momentum (no optimizer state: a whole 7B model's weights and grads fit one GPU); ``cp`` context
    parallelism, ``sp`` sequence parallelism."""
    from megarl.config import load_config, typed_config

    dp = dist.get_world_size() // (tp * cp)
    a = "actor_rollout_ref.actor"
    cfg = load_config([
        f"actor_rollout_ref.model.path={model_path}", f"actor_rollout_ref.model.use_remove_padding={remove_padding}",
        f"{a}.megatron.tensor_model_parallel_size={tp}", f"{a}.megatron.use_distributed_optimizer={dist_opt}",
        f"{a}.megatron.sequence_parallel={str(sp).lower()}", f"{a}.megatron.context_parallel_size={cp}", f"{a}.ppo_mini_batch_size={micro_bs * n_micro * dp}",
        f"{a}.ppo_micro_batch_size_per_gpu={micro_bs}", f"{a}.shuffle=false", f"{a}.use_kl_loss=false",
        f"{a}.optim.lr_decay_style=constant", f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro_bs}",
        "actor_rollout_ref.rollout.n=1", f"{a}.optim.optimizer={optimizer}",
        *([f"++{a}.optim.override_optimizer_config.sgd_momentum=0.0"] if optimizer == "sgd" else []),
        # auto: TE picks its kernels (verl's default `flash` needs the flash-attn package, absent on the GPU machine)
        *[f"++{a}.megatron.override_transformer_config.{k}={v}"
          for k, v in {"transformer_impl": impl, "attention_backend": "auto", **(overrides or {})}.items()],
        *([] if torch.cuda.is_available() else [f"{a}.megatron.dtype=float32"]),
    ])
    return typed_config(cfg).actor_rollout_ref


def full_length_batch(batches: list[torch.Tensor], response_len: int, seed: int = 0):
    """DataProto of the benchmark's token rows (no padding): the last `response_len`
    tokens of each row are the response."""
    from megarl.protocol import DataProto

    input_ids = torch.cat([b.cpu() for b in batches])  # [B, S]
    B, S = input_ids.shape
    g = torch.Generator().manual_seed(seed)
    return DataProto.from_dict(
        {
            "input_ids": input_ids,
            "attention_mask": torch.ones(B, S, dtype=torch.long),
            "position_ids": torch.arange(S).unsqueeze(0).expand(B, -1).contiguous(),
            "responses": input_ids[:, -response_len:].contiguous(),
            "response_mask": torch.ones(B, response_len, dtype=torch.long),
            "old_log_probs": -torch.rand(B, response_len, generator=g) * 2 - 10,
            "advantages": torch.randn(B, response_len, generator=g),
        },
        meta_info={"temperature": 1.0, "nan_policy": "stop"},
    )


def legacy_lm_head_hooks(worker, vocab_size: int) -> None:
    """Benchmark-only: put back the LM-head hooks megarl had until 2026-11-23 (an
    out-of-place masked_fill of the padded vocab columns, and GPTModel's own
    ``[s, b] -> [b, s]`` logits copy), to time the previous version in the same run."""
    from megatron.core import parallel_state

    from megarl.models import unwrap_chunk

    def masked_fill_hook(module, inputs, output):
        logits, bias = output
        local = logits.shape[-1]
        tp_rank = parallel_state.get_tensor_model_parallel_rank()
        full = local * parallel_state.get_tensor_model_parallel_world_size()
        start = 0 if local == full else tp_rank * local
        ids = torch.arange(start, start + local, device=logits.device)
        return logits.masked_fill(ids >= vocab_size, torch.finfo(logits.dtype).min / 2), bias

    for chunk in worker.engine.chunks:
        head = getattr(unwrap_chunk(chunk), "output_layer", None)
        if head is None:
            continue
        head._forward_pre_hooks.clear()
        head._forward_hooks.clear()
        head.register_forward_hook(masked_fill_hook)


def build_actor_step(
    shape, seq_len, tp, micro_bs, n_micro, device, batches, *, remove_padding=False, model_dir=None, legacy=False,
    impl="local", overrides=None, optimizer="adam",
):
    """(step callable running one update_policy, the worker). ``legacy``: the LM-head
    hooks of the previous version (see :func:`legacy_lm_head_hooks`)."""
    from megarl.workers.actor import ActorWorker

    model_dir = model_dir or os.path.join(os.environ.get("TMPDIR", "/tmp"), f"megarl_bench_{shape['hidden_size']}_{shape['num_hidden_layers']}")
    write_random_hf_dir(shape, model_dir)
    cfg = actor_config(model_dir, tp, micro_bs, n_micro, remove_padding,
                       dist_opt=device.type == "cuda" and optimizer == "adam", impl=impl, overrides=overrides,
                       optimizer=optimizer)
    worker = ActorWorker(cfg, role="actor", device=device.type)
    worker.init_model()
    if legacy:
        legacy_lm_head_hooks(worker, shape["vocab_size"])
    data = full_length_batch(batches, response_len=seq_len * 3 // 4)

    def step():
        return worker.update_policy(data)

    return step, worker
