"""Tiny Qwen2 model, rollout-shaped batches, configs and HF references for worker tests."""

from __future__ import annotations

import torch
import transformers
from omegaconf import OmegaConf

PROMPT_LEN, RESPONSE_LEN, VOCAB = 6, 5, 97  # 97: not divisible by TP=2 (vocab padding)


def make_tiny_qwen2(out_dir: str, *, vocab_size: int = VOCAB, num_layers: int = 4, seed: int = 0) -> str:
    """Random-init Qwen2 (QKV bias, untied head) saved as safetensors; no downloads."""
    config = transformers.Qwen2Config(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=num_layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6,
        tie_word_embeddings=False, attention_dropout=0.0, dtype="float32",
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # non-default norms/biases so a wrong mapping cannot hide
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                param.normal_(0, 0.1)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


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


def megatron_node(**sizes) -> dict:
    return {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "seed": 42, **sizes}


def actor_rollout_ref_config(model_path: str, megatron: dict, **actor_overrides):
    """A small `actor_rollout_ref` DictConfig with verl key names."""
    actor = {
        "ppo_mini_batch_size": 8, "ppo_micro_batch_size_per_gpu": 8, "use_dynamic_bsz": False,
        "ppo_max_token_len_per_gpu": 64, "ppo_epochs": 1, "shuffle": False, "data_loader_seed": 1,
        "clip_ratio": 0.2, "clip_ratio_c": 3.0, "policy_loss": {"loss_mode": "vanilla"},
        "loss_agg_mode": "token-mean", "entropy_coeff": 0.01, "use_kl_loss": True, "kl_loss_coef": 0.1,
        "kl_loss_type": "low_var_kl",
        # SGD (momentum 0.9): a step proportional to the gradient, unlike Adam's first step.
        "optim": {"optimizer": "sgd", "lr": 0.5, "lr_warmup_steps": -1, "lr_warmup_steps_ratio": 0.0,
                  "lr_decay_style": "constant", "min_lr_ratio": 0.0, "weight_decay": 0.01,
                  "betas": [0.9, 0.999], "clip_grad": 1.0, "total_training_steps": -1,
                  "use_checkpoint_opt_param_scheduler": False},
        "checkpoint": {"save_contents": ["model", "optimizer", "extra"], "load_contents": ["model", "optimizer", "extra"]},
        "megatron": megatron,
    }
    actor.update(actor_overrides)
    return OmegaConf.create({
        "model": {"path": model_path, "override_config": {}, "use_remove_padding": False},
        "actor": actor,
        "ref": {"log_prob_micro_batch_size_per_gpu": 4, "megatron": megatron},
        "rollout": {"n": 1, "temperature": 0.7, "log_prob_micro_batch_size_per_gpu": 3,
                    "log_prob_use_dynamic_bsz": False, "log_prob_max_token_len_per_gpu": 64},
    })


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


def critic_config(model_path: str, megatron: dict, **overrides):
    """A small `critic` DictConfig with verl key names."""
    cfg = {
        "model": {"path": model_path, "override_config": {}},
        "megatron": megatron,
        "optim": {"optimizer": "sgd", "lr": 0.5, "lr_warmup_steps": -1, "lr_decay_style": "constant",
                  "weight_decay": 0.01, "betas": [0.9, 0.999], "clip_grad": 1.0, "total_training_steps": -1,
                  "use_checkpoint_opt_param_scheduler": False},
        "ppo_mini_batch_size": 8, "ppo_micro_batch_size_per_gpu": 4, "use_dynamic_bsz": False,
        "ppo_max_token_len_per_gpu": 64, "ppo_epochs": 1, "shuffle": False, "cliprange_value": 0.5,
        "loss_agg_mode": "token-mean",
    }
    cfg.update(overrides)
    return OmegaConf.create(cfg)


def hf_values(model_path: str, batch: dict, head: torch.Tensor) -> torch.Tensor:
    """HF backbone's final hidden states times the value head, aligned to responses `[B, R]`."""
    model = transformers.AutoModel.from_pretrained(model_path, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        hidden = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).last_hidden_state.double()
    values = (hidden @ head.double().T)[..., 0][:, PROMPT_LEN - 1 : -1]
    return (values * batch["response_mask"]).float()
