"""The demo task is learnable the way the quickstart needs: a bare GRPO loop on the demo
model (HF transformers, sampling on CPU, 16 prompts x 16 samples, 1-token responses, as the
quickstart yaml) lifts the mean reward from the random-policy level (~0.03) above what the
best constant answer earns (always "9": 0.19 + 0.1 * 0.81 = 0.27 on 2-digit prompts).

This checks the task design, not megarl's trainer: the loop here is independent of it.
"""

import pytest
import torch

from megarl.data.demo_data import generate_rows
from megarl.data.demo_model import build_demo_model
from megarl.data.demo_tokenizer import build_demo_tokenizer
from megarl.reward.demo_task import compute_score

pytestmark = pytest.mark.slow

# lr 1e-3, not the yaml's 3e-3: this plain loop (no Megatron optimizer details) at 3e-3 swings
# between the best constant and above it from step to step (measured: last-5 means 0.26-0.39).
PROMPTS, MINI_BATCH, SAMPLES, RESPONSE_LEN, STEPS, LR, CLIP = 16, 8, 16, 1, 30, 1e-3, 0.2


def sample(model, prompt_ids: torch.Tensor, eos: int, pad: int) -> torch.Tensor:
    """``[N, RESPONSE_LEN]`` sampled tokens at temperature 1; pad after eos."""
    seq, done = prompt_ids, torch.zeros(len(prompt_ids), dtype=torch.bool)
    with torch.no_grad():
        for _ in range(RESPONSE_LEN):
            token = torch.distributions.Categorical(logits=model(seq).logits[:, -1]).sample()
            token = torch.where(done, torch.full_like(token, pad), token)
            done |= token == eos
            seq = torch.cat([seq, token[:, None]], dim=1)
    return seq[:, prompt_ids.shape[1]:]


def log_probs(model, seq: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
    """``[N, RESPONSE_LEN]`` log-probs of ``responses`` (the tail of ``seq``)."""
    logits = model(seq).logits[:, seq.shape[1] - responses.shape[1] - 1:-1]
    return torch.log_softmax(logits, dim=-1).gather(-1, responses[..., None]).squeeze(-1)


def test_grpo_raises_reward_within_30_steps():
    torch.manual_seed(0)
    tokenizer = build_demo_tokenizer()
    model = build_demo_model(tokenizer).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    rows = generate_rows("train", PROMPTS * STEPS, seed=0)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    rewards_per_step = []
    for step in range(STEPS):
        batch = rows[step * PROMPTS:(step + 1) * PROMPTS]
        texts = [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in batch]
        prompt_ids = torch.tensor([tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts])
        prompt_ids = prompt_ids.repeat_interleave(SAMPLES, dim=0)  # all demo prompts have 9 tokens
        responses = sample(model, prompt_ids, eos, pad)
        is_eos = (responses == eos).long()
        response_mask = ((torch.cumsum(is_eos, dim=1) - is_eos) == 0).float()  # up to and incl. eos
        decoded = tokenizer.batch_decode(responses, skip_special_tokens=True)
        truths = [r["reward_model"]["ground_truth"] for r in batch for _ in range(SAMPLES)]
        reward = torch.tensor([compute_score(d, t) for d, t in zip(decoded, truths)])
        groups = reward.view(PROMPTS, SAMPLES)
        advantage = ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-6)).view(-1, 1)

        seq = torch.cat([prompt_ids, responses], dim=1)
        with torch.no_grad():
            old_log_prob = log_probs(model, seq, responses)
        # PPO as the yaml: an optimizer step per mini-batch of 8 prompts, ratio clip 0.2, grad norm clip 1.0
        for mb in torch.arange(len(seq)).split(MINI_BATCH * SAMPLES):
            ratio = torch.exp(log_probs(model, seq[mb], responses[mb]) - old_log_prob[mb])
            token_loss = -torch.min(ratio * advantage[mb], ratio.clamp(1 - CLIP, 1 + CLIP) * advantage[mb])
            loss = (token_loss * response_mask[mb]).sum() / response_mask[mb].sum()
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        rewards_per_step.append(reward.mean().item())

    start = sum(rewards_per_step[:3]) / 3
    end = sum(rewards_per_step[-5:]) / 5
    assert start < 0.08, rewards_per_step
    # measured last-5 means 0.39 / 0.52 / 0.47 for torch seeds 0 / 1 / 2; best constant 0.27
    assert end > 0.33, rewards_per_step
