"""Shared pieces of the GPU benchmarks: model shapes, FLOP counts, timing, process setup.

Everything here imports only torch, megatron-core and (lazily) transformers, so the
benchmarks run on the GPU image, which has neither vLLM nor Ray.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

# Qwen2.5-1.5B's shape (random weights are enough for throughput).
QWEN25_1P5B: dict = dict(
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    hidden_act="silu",
)

# Qwen2.5-7B's shape (untied LM head).
QWEN25_7B: dict = dict(
    QWEN25_1P5B,
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    vocab_size=152064,
    tie_word_embeddings=False,
)

# A few-MB model with the same structure (GQA, qkv bias, tied embeddings) for CPU dry runs
# and GPU tests.
QWEN2_TINY: dict = dict(
    QWEN25_1P5B,
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    max_position_embeddings=512,
)

# Qwen2.5-7B: 7.62e9 parameters (untied 152064x3584 embedding and head), bf16.
QWEN25_7B_BYTES: int = 2 * 7_615_616_512

H200_BF16_PEAK_TFLOPS: float = 989.0  # dense bf16 datasheet figure used for MFU


def hf_config(shape: dict):
    """A transformers Qwen2Config of `shape` (what megarl.models.build_model takes)."""
    from transformers import Qwen2Config

    return Qwen2Config(**shape, torch_dtype="bfloat16")


def matmul_params(shape: dict) -> int:
    """Parameters that take part in matrix products per token (all linear layers and the
    LM head; the embedding lookup and the norms are not counted)."""
    h, f, L = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    hd = h // shape["num_attention_heads"]
    kv = shape["num_key_value_heads"] * hd
    per_layer = h * (h + 2 * kv) + h * h + 3 * h * f
    return L * per_layer + shape["vocab_size"] * h


def train_flops_per_token(shape: dict, seq_len: int) -> float:
    """Training FLOPs per token: 6*N + 6*L*s*d.

    6*N: forward (2N) + backward (4N) of the matrix-product parameters N (`matmul_params`).
    6*L*s*d: causal attention scores and weighted sum, d = heads*head_dim; a full
    (non-causal) count would be 12*L*s*d, the causal mask halves it.
    """
    d = shape["hidden_size"]
    return 6.0 * matmul_params(shape) + 6.0 * shape["num_hidden_layers"] * seq_len * d


def fwd_flops_per_token(shape: dict, seq_len: int) -> float:
    """Forward-only FLOPs per token (a third of `train_flops_per_token`)."""
    return train_flops_per_token(shape, seq_len) / 3.0


def device_and_backend() -> tuple[torch.device, str]:
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


def init_process_group() -> torch.device:
    """torch.distributed from torchrun's environment; returns this rank's device."""
    device, backend = device_and_backend()
    if not dist.is_initialized():
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend, **kwargs)
    return device


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_it(fn: Callable[[], object], device: torch.device, warmup: int, iters: int) -> list[float]:
    """Seconds per call of `fn` for `iters` calls after `warmup` calls (host clock around
    a device synchronize, so asynchronous work is counted)."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return times


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def rank0_print(*args) -> None:
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(*args, flush=True)


def write_json(name: str, payload: dict) -> None:
    """Writes `payload` to $OUT/<name> (or ./outputs/<name> off the GPU machine), rank 0."""
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    out_dir = os.environ.get("OUT") or os.path.join(os.getcwd(), "outputs")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump(payload, f, indent=1, default=str)


@dataclass
class MemProbe:
    """Peak-memory delta over a region: max_memory_allocated minus what was allocated
    when the region began (bytes). CPU: always 0."""

    device: torch.device
    start: int = 0

    def __enter__(self) -> "MemProbe":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start = torch.cuda.memory_allocated(self.device)
        return self

    def __exit__(self, *exc) -> None:
        pass

    def peak_extra(self) -> int:
        if self.device.type != "cuda":
            return 0
        torch.cuda.synchronize(self.device)
        return torch.cuda.max_memory_allocated(self.device) - self.start


# --------------------------------------------------------------------------------------
# A plain megatron-core GPT with SDPA core attention: the benchmark's own reference model,
# independent of megarl.models.
# --------------------------------------------------------------------------------------


def sdpa_core_attention_class():
    """Megatron core-attention module that calls torch SDPA (flash backend on Hopper when
    no mask is given). Defined lazily so that importing this file needs no megatron."""
    from megatron.core.transformer.module import MegatronModule

    class SDPACoreAttention(MegatronModule):
        def __init__(
            self,
            config,
            layer_number,
            attn_mask_type,
            attention_type,
            attention_dropout=None,
            softmax_scale=None,
            cp_comm_type=None,
            pg_collection=None,
        ):
            super().__init__(config=config)
            self.softmax_scale = softmax_scale
            self.dropout_p = (
                config.attention_dropout if attention_dropout is None else attention_dropout
            )

        def forward(
            self,
            query,
            key,
            value,
            attention_mask,
            attn_mask_type=None,
            attention_bias=None,
            packed_seq_params=None,
        ):
            # [s, b, heads, hd] -> [b, heads, s, hd]
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
            out = F.scaled_dot_product_attention(
                q,
                k,
                v,
                is_causal=True,
                scale=self.softmax_scale,
                dropout_p=self.dropout_p if self.training else 0.0,
                enable_gqa=q.size(1) != k.size(1),
            )
            # [b, heads, s, hd] -> [s, b, heads*hd]
            return out.permute(2, 0, 1, 3).reshape(out.size(2), out.size(0), -1)

    return SDPACoreAttention


def plain_transformer_config(shape: dict, tp: int, dtype: torch.dtype, on_cpu: bool = False):
    """megatron-core TransformerConfig of a Qwen2 shape, without transformer-engine."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=shape["num_hidden_layers"],
        hidden_size=shape["hidden_size"],
        ffn_hidden_size=shape["intermediate_size"],
        num_attention_heads=shape["num_attention_heads"],
        num_query_groups=shape["num_key_value_heads"],
        kv_channels=shape["hidden_size"] // shape["num_attention_heads"],
        normalization="RMSNorm",
        layernorm_epsilon=shape["rms_norm_eps"],
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        sequence_parallel=False,
        bf16=dtype == torch.bfloat16,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        gradient_accumulation_fusion=False,
        bias_activation_fusion=True,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        use_cpu_initialization=on_cpu,
    )


def plain_gpt_model(shape: dict, seq_len: int, tp: int, dtype: torch.dtype, device, impl: str = "local",
                    overrides: dict | None = None):
    """Megatron GPTModel for the current TP rank. ``impl`` (megatron's ``transformer_impl``):
    ``local`` = local spec with SDPA core attention, ``transformer_engine`` = megatron's TE spec.
    ``overrides``: further TransformerConfig fields (e.g. ``fp8``), as megarl's arm gets them."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
    )

    cfg = plain_transformer_config(shape, tp, dtype, on_cpu=torch.device(device).type == "cpu")
    if impl == "transformer_engine":
        spec = get_gpt_layer_with_transformer_engine_spec()
    elif impl == "local":
        spec = get_gpt_layer_local_spec(normalization="RMSNorm")
        spec.submodules.self_attention.submodules.core_attention = sdpa_core_attention_class()
    else:
        raise ValueError(f"impl {impl!r}: transformer_engine or local")
    cfg.transformer_impl = impl
    # TE's fused RoPE, as megarl's TE spec runs it (weight-gradient accumulation fusion needs apex
    # in plain megatron-core: off here; bench_actor_throughput's padded_unfused arm matches that)
    cfg.apply_rope_fusion = impl == "transformer_engine"
    for key, value in (overrides or {}).items():
        setattr(cfg, key, value)
    with torch.device(device):
        model = GPTModel(
            config=cfg,
            transformer_layer_spec=spec,
            vocab_size=shape["vocab_size"],
            max_sequence_length=max(seq_len, shape["max_position_embeddings"]),
            pre_process=True,
            post_process=True,
            share_embeddings_and_output_weights=shape["tie_word_embeddings"],
            position_embedding_type="rope",
            rotary_base=int(shape["rope_theta"]),
        )
    return model.to(device=device, dtype=dtype)


def seed_everything(seed: int, device: torch.device) -> None:
    torch.manual_seed(seed)
    if device.type == "cuda":
        from megatron.core import tensor_parallel

        tensor_parallel.model_parallel_cuda_manual_seed(seed)
