"""Tiny Qwen2 model, rollout-shaped batches, configs and HF references for worker tests."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from omegaconf import OmegaConf

from megarl.config.files import CONFIG_DIR, CONFIG_NAME
from megarl.config.schema.actor import ActorRolloutRefConfig
from megarl.config.schema.critic import CriticConfig
from megarl.config.schema.root import MegaRLConfig

PROMPT_LEN, RESPONSE_LEN, VOCAB = 6, 5, 97  # 97: not divisible by TP=2 (vocab padding)


def make_tiny_model(out_dir: str, family: str = "qwen2", *, vocab_size: int = VOCAB, num_layers: int = 4,
                    hidden_size: int = 32, intermediate_size: int = 64, max_positions: int = 64,
                    head_dim: int | None = None, seed: int = 0) -> str:
    """Random-init Qwen2 (QKV bias) or Qwen3 (q/k norms), untied head, 4 heads GQA 4:2, saved as
    fp32 safetensors, with non-default norms and biases so a wrong weight mapping cannot hide;
    no downloads."""
    cls = {"qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[family]
    config = cls(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=max_positions, rms_norm_eps=1e-6, tie_word_embeddings=False,
        attention_dropout=0.0, dtype="float32", **({"head_dim": head_dim} if head_dim else {}),
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    unusual_norms_and_biases_(model)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


@torch.no_grad()
def unusual_norms_and_biases_(model: torch.nn.Module) -> None:
    """Norm weights in [0.5, 1.5] and biases ~ N(0, 0.1) instead of HF's ones and zeros, so a
    wrong or missing mapping of either changes the output."""
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.uniform_(0.5, 1.5)
        elif name.endswith(".bias"):
            param.normal_(0, 0.1)


def make_tiny_qwen2(out_dir: str, *, vocab_size: int = VOCAB, num_layers: int = 4, seed: int = 0) -> str:
    return make_tiny_model(out_dir, "qwen2", vocab_size=vocab_size, num_layers=num_layers, seed=seed)


def rollout_batch(batch_size: int = 8, seed: int = 1) -> dict[str, torch.Tensor]:
    """Left-padded prompts + right-padded responses, with advantages and old log-probs."""
    gen = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(2, PROMPT_LEN + 1, (batch_size,), generator=gen)
    response_lens = torch.randint(1, RESPONSE_LEN + 1, (batch_size,), generator=gen)
    prompt_mask = (torch.arange(PROMPT_LEN) >= PROMPT_LEN - prompt_lens[:, None]).long()
    response_mask = (torch.arange(RESPONSE_LEN) < response_lens[:, None]).long()
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    input_ids = torch.randint(0, VOCAB, attention_mask.shape, generator=gen) * attention_mask
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    responses = input_ids[:, PROMPT_LEN:]
    return {
        "input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
        "responses": responses, "response_mask": response_mask,
        "advantages": torch.randn(batch_size, RESPONSE_LEN, generator=gen) * response_mask,
        "old_log_probs": (-torch.rand(batch_size, RESPONSE_LEN, generator=gen) * 3 - 2) * response_mask,
        "ref_log_prob": (-torch.rand(batch_size, RESPONSE_LEN, generator=gen) * 3 - 2) * response_mask,
        "values": torch.randn(batch_size, RESPONSE_LEN, generator=gen) * response_mask,
        "returns": torch.randn(batch_size, RESPONSE_LEN, generator=gen) * response_mask,
    }


def optim_node(**values) -> dict:
    """The yaml's `critic.optim` (every verl optimizer key at its default) with `values` set."""
    yaml = Path(CONFIG_DIR) / f"{CONFIG_NAME}.yaml"
    node = OmegaConf.to_container(OmegaConf.load(yaml).critic.optim)
    unknown = set(values) - set(node)
    assert not unknown, f"not optim keys: {unknown}"
    return {**node, **values}


def megatron_node(**sizes) -> dict:
    """`megatron` keys a test sets; the rest come from the project yaml."""
    return {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "seed": 42, **sizes}


def project_config(model_path: str, settings: dict, megatron: dict, megatron_sections: tuple[str, ...]) -> MegaRLConfig:
    """The project yaml (megarl.config.load_config: production defaults) with `settings`
    ({dotted key: value}; dict values merge into their node) applied, as the typed config a run gets.

    `megatron` goes to the actor's megatron node (the ref / critic sizes follow it by
    interpolation) and to the keys each `<section>.megatron` holds itself (e.g. ref.param_offload).
    """
    from megarl.config import load_config, typed_config

    from helpers.cpu_config import CPU_SMALL

    # A real run's config (no demo profile: the model path is given); struct mode: a key the yaml lacks raises.
    cfg = load_config([*CPU_SMALL, f"actor_rollout_ref.model.path={model_path}"])
    layout = {f"actor_rollout_ref.actor.megatron.{k}": v for k, v in megatron.items()}
    for section in megatron_sections:
        node = OmegaConf.select(cfg, f"{section}.megatron")
        layout.update({f"{section}.megatron.{k}": v for k, v in megatron.items() if k in node})
    for key, value in {"actor_rollout_ref.model.path": model_path, **layout, **settings}.items():
        # override_transformer_config is free-form (TransformerConfig fields, checked by the config rules)
        OmegaConf.update(cfg, key, value, merge=True, force_add="override_transformer_config" in key)
    return typed_config(cfg)


# What the actor tests depend on; every other key keeps the yaml's value.
_ACTOR = {
    "ppo_mini_batch_size": 8, "ppo_micro_batch_size_per_gpu": 8, "use_dynamic_bsz": False,
    "ppo_max_token_len_per_gpu": 64, "ppo_epochs": 1, "shuffle": False, "data_loader_seed": 1,
    "clip_ratio": 0.2, "clip_ratio_low": None, "clip_ratio_high": None, "clip_ratio_c": 3.0,
    "policy_loss": {"loss_mode": "vanilla"}, "loss_agg_mode": "token-mean", "loss_scale_factor": None,
    "entropy_coeff": 0.01, "use_kl_loss": True, "kl_loss_coef": 0.1, "kl_loss_type": "low_var_kl",
    "calculate_sum_pi_squared": False,
    # SGD (momentum 0.9): a step proportional to the gradient, unlike Adam's first step.
    "optim": {"optimizer": "sgd", "lr": 0.5, "lr_warmup_steps": -1, "lr_warmup_steps_ratio": 0.0,
              "lr_decay_style": "constant", "min_lr": 0.0, "weight_decay": 0.01,
              "betas": [0.9, 0.999], "clip_grad": 1.0, "total_training_steps": -1},
    "checkpoint": {"save_contents": ["model", "optimizer", "extra"], "load_contents": ["model", "optimizer", "extra"]},
}


def _common_settings() -> dict:
    return {
        "actor_rollout_ref.model.override_config": {}, "actor_rollout_ref.model.use_remove_padding": False,
        "actor_rollout_ref.rollout.n": 1, "actor_rollout_ref.rollout.temperature": 0.7,
    }


def actor_rollout_ref_config(model_path: str, megatron: dict, settings: dict | None = None,
                             **actor_overrides) -> ActorRolloutRefConfig:
    """The `actor_rollout_ref` node of the project yaml, sized for the tiny model; `settings`:
    {dotted key under actor_rollout_ref (e.g. "model.use_remove_padding"): value}, applied last."""
    keys = {
        **_common_settings(),
        **{f"actor_rollout_ref.actor.{k}": v for k, v in {**_ACTOR, **actor_overrides}.items()},
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 3,
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": False,
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": 64,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 4,
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": False,
        **{f"actor_rollout_ref.{k}": v for k, v in (settings or {}).items()},
    }
    return project_config(model_path, keys, megatron, ("actor_rollout_ref.ref",)).actor_rollout_ref


def critic_config(model_path: str, megatron: dict, **overrides) -> CriticConfig:
    """The `critic` node of the project yaml, sized for the tiny model (rollout.n = 1)."""
    critic = {
        "model": {"override_config": {}, "use_remove_padding": False},
        "optim": {"optimizer": "sgd", "lr": 0.5, "lr_warmup_steps": -1, "lr_decay_style": "constant", "min_lr": 0.0,
                  "weight_decay": 0.01, "betas": [0.9, 0.999], "clip_grad": 1.0, "total_training_steps": -1},
        "ppo_mini_batch_size": 8, "ppo_micro_batch_size_per_gpu": 4, "use_dynamic_bsz": False,
        "ppo_max_token_len_per_gpu": 64, "forward_max_token_len_per_gpu": 64, "ppo_epochs": 1, "shuffle": False,
        "cliprange_value": 0.5, "loss_agg_mode": "token-mean", "loss_scale_factor": None,
        **overrides,
    }
    settings = {
        **_common_settings(),
        **{f"critic.{k}": v for k, v in critic.items()},
    }
    return project_config(model_path, settings, megatron, ("critic",)).critic


def _hf_response_log_softmax(model_path: str, batch: dict, temperature: float) -> torch.Tensor:
    """HF transformers log_softmax(logits / temperature) at the response positions `[B, R, V]` (fp64)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits.double()
    return torch.log_softmax(logits[:, PROMPT_LEN - 1 : -1] / temperature, dim=-1)


def hf_response_sum_pi_squared(model_path: str, batch: dict, temperature: float) -> torch.Tensor:
    """HF transformers reference: sum_v softmax(logits / temperature)_v^2 per response token `[B, R]`."""
    spp = _hf_response_log_softmax(model_path, batch, temperature).exp().square().sum(-1)
    return (spp * batch["response_mask"].double()).float()


def hf_response_log_probs(model_path: str, batch: dict, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """HF transformers reference: (log-probs, entropy) of the response tokens `[B, R]`."""
    logp_all = _hf_response_log_softmax(model_path, batch, temperature)
    logp = logp_all.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    mask = batch["response_mask"].double()
    return (logp * mask).float(), (entropy * mask).float()


def hf_values(model_path: str, batch: dict, head: torch.Tensor) -> torch.Tensor:
    """HF backbone's final hidden states times the value head, aligned to responses `[B, R]`."""
    model = transformers.AutoModel.from_pretrained(model_path, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        hidden = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).last_hidden_state.double()
    values = (hidden @ head.double().T)[..., 0][:, PROMPT_LEN - 1 : -1]
    return (values * batch["response_mask"]).float()


TEMPERATURE = 0.7  # the worker bodies' sampling temperature (meta_info of their batches)


def worker_data(batch: dict, rows: slice | None = None):
    """``batch`` (or its ``rows``) as the DataProto a worker method gets."""
    from megarl.protocol import DataProto

    tensors = {k: (v[rows] if rows is not None else v) for k, v in batch.items()}
    return DataProto.from_dict(tensors, meta_info={"temperature": TEMPERATURE, "nan_policy": "stop"})


def dp_rows(batch: dict) -> slice:
    """This rank's data-parallel share of ``batch``'s rows."""
    from megatron.core import parallel_state

    size = next(iter(batch.values())).shape[0] // parallel_state.get_data_parallel_world_size()
    rank = parallel_state.get_data_parallel_rank()
    return slice(rank * size, (rank + 1) * size)
