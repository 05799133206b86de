"""The demo model's warm-up: a short supervised run on the task, stopped early on purpose.

Why: from random weights a policy almost never samples an exact answer (1-2 right tokens,
then EOS, out of 64 tokens a step), so every GRPO group would score 0 and nothing would be
learned. ``warm_up`` trains the random-init model with plain torch (next-token
cross-entropy on the answer tokens and EOS of ``STEPS x BATCH`` rows of the task's
``warmup`` split) and stops in the middle of the learning curve: the model then writes a
well-formed answer (digits, then EOS) to every problem but gets about 40% of them right
(greedy), so GRPO has both reward variance within groups and room to improve.

Measured on the 200 problems (greedy accuracy after N steps of this recipe, seed 0; every
answer well formed): 50 steps 0.105, 100: 0.305, 150: 0.38, 200: 0.55, 300: 0.85, 400:
0.865; 150 steps take ~6 s on one core. GRPO from 150 steps: tests/data/test_demo_learnable.py,
docs/quickstart_run.md.

Deterministic given the seed on one machine: seeded data and init, one torch thread while
it runs (a multi-threaded CPU matmul may sum in another order with another thread
count), the caller's RNG state and thread count restored afterwards.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from megarl.data.demo_data import generate_rows

# Changing any value below changes the demo model: bump megarl.data.demo.MODEL_VERSION.
STEPS = 150  # optimizer steps; under-trained on purpose (see the module docstring)
BATCH = 64  # examples per step
TOOL_STEPS = 200  # the tool task's warm-up (warm_up_tools): sampled call rate 0.29, 0.72 of those calls right (100 val problems)
LR = 3.0e-3  # AdamW peak lr; at 6e-3 (no lr warm-up) the model did not learn the table in 400 steps
LR_WARMUP_STEPS = 30  # linear lr ramp over the first steps on random weights (similar curve without it)
BETAS = (0.9, 0.98)  # a shorter second-moment memory, common for small transformers
SEED = 0
IGNORE_INDEX = -100  # torch cross_entropy's ignore_index: prompt and padding positions


def _prompt_ids(tokenizer: PreTrainedTokenizerBase, row: dict) -> list[int]:
    """The row's prompt as megarl's dataset tokenizes it (chat template with the generation
    prompt, no extra special tokens), so the model learns exactly what the rollout asks."""
    text = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def segments_batch(sequences: list[list[tuple[list[int], bool]]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids ``[N, L]`` (each sequence's segments in order, right-padded with ``pad_token_id``)
    and labels ``[N, L]`` (the ids of the segments flagged trained; ``IGNORE_INDEX`` elsewhere)."""
    length = max(sum(len(ids) for ids, _ in segments) for segments in sequences)
    input_ids = torch.full((len(sequences), length), pad_token_id, dtype=torch.long)
    labels = torch.full((len(sequences), length), IGNORE_INDEX, dtype=torch.long)
    for i, segments in enumerate(sequences):
        start = 0
        for ids, trained in segments:
            input_ids[i, start:start + len(ids)] = torch.tensor(ids, dtype=torch.long)
            if trained:
                labels[i, start:start + len(ids)] = torch.tensor(ids, dtype=torch.long)
            start += len(ids)
    return input_ids, labels


def warmup_batch(tokenizer: PreTrainedTokenizerBase, rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids ``[N, L]`` (chat-templated prompt, answer, EOS, right-padded with the pad id)
    and labels ``[N, L]`` (the answer and EOS ids; ``IGNORE_INDEX`` elsewhere)."""
    eos = tokenizer.eos_token_id
    return segments_batch([[(_prompt_ids(tokenizer, row), False),
                            (_ids(tokenizer, row["reward_model"]["ground_truth"]) + [eos], True)] for row in rows],
                          tokenizer.pad_token_id)


def tool_warmup_batch(tokenizer: PreTrainedTokenizerBase, rows: list[dict], calls: list[bool]) -> tuple[torch.Tensor, torch.Tensor]:
    """Like :func:`warmup_batch` for the tool task (``megarl.data.demo_tool_data``): a row with
    ``calls[i]`` is the tool trajectory (trained: the call turn and EOS, then the answer and EOS;
    not trained: the observation, rendered by the chat template as the tool agent appends it),
    the others a direct answer."""
    from megarl.data.demo_tool_data import tool_call_text

    eos = tokenizer.eos_token_id
    sequences = []
    for row, call in zip(rows, calls):
        truth = row["reward_model"]["ground_truth"]
        answer_ids = _ids(tokenizer, truth) + [eos]
        segments = [(_prompt_ids(tokenizer, row), False)]
        if call:
            turn = {"role": "assistant", "content": tool_call_text(row["extra_info"]["expression"])}
            before = tokenizer.apply_chat_template(row["prompt"] + [turn], tokenize=False)
            after = tokenizer.apply_chat_template(row["prompt"] + [turn, {"role": "tool", "content": truth}],
                                                  tokenize=False, add_generation_prompt=True)
            segments += [(_ids(tokenizer, turn["content"]) + [eos], True), (_ids(tokenizer, after[len(before):]), False)]
        sequences.append(segments + [(answer_ids, True)])
    return segments_batch(sequences, tokenizer.pad_token_id)


def warm_up(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, steps: int = STEPS, seed: int = SEED) -> list[float]:
    """Train ``model`` in place for ``steps`` steps; return the loss of each step (nats per
    answer token). The model is left in eval mode."""
    return _train(model, *warmup_batch(tokenizer, generate_rows("warmup", steps * BATCH, seed)), steps, seed)


def warm_up_tools(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, steps: int = TOOL_STEPS,
                  seed: int = SEED) -> list[float]:
    """:func:`warm_up` on the tool task (``tool_warmup_batch``): ``TOOL_CALL_FRACTION`` of the rows
    call the calculator. ``tokenizer``: the tool variant (``build_demo_tokenizer(with_tools=True)``)."""
    from megarl.data.demo_tool_data import TOOL_CALL_FRACTION, generate_tool_rows

    rows = generate_tool_rows("warmup", steps * BATCH, seed)
    calls = (np.random.Generator(np.random.PCG64(seed)).random(len(rows)) < TOOL_CALL_FRACTION).tolist()
    return _train(model, *tool_warmup_batch(tokenizer, rows, calls), steps, seed)


def _train(model: PreTrainedModel, input_ids: torch.Tensor, labels: torch.Tensor, steps: int, seed: int) -> list[float]:
    threads = torch.get_num_threads()
    losses: list[float] = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        torch.set_num_threads(1)
        try:
            optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=0.0)
            schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / LR_WARMUP_STEPS))
            model.train()
            for step in range(steps):
                batch = slice(step * BATCH, (step + 1) * BATCH)
                logits = model(input_ids[batch]).logits[:, :-1]  # position t predicts token t + 1
                loss = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), labels[batch, 1:].reshape(-1), ignore_index=IGNORE_INDEX
                )
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                schedule.step()
                losses.append(loss.item())
        finally:
            torch.set_num_threads(threads)
            model.eval()
    return losses
