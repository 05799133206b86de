"""The demo model's warm-up: a short supervised run on the task, stopped early on purpose.

Why: from random weights a policy almost never samples an exact answer (1-2 right tokens,
then EOS, out of 64 tokens a step), so every GRPO group would score 0 and nothing would be
learned. ``warm_up`` trains the random-init model with plain torch (next-token
cross-entropy on the answer tokens and EOS of ``BATCH`` rows a step of the task's
``warmup`` split) and stops in the middle of the learning curve, on a measured criterion:
from ``MIN_STEPS`` on, after every step, the greedy answers to the 200 problems are
measured (``measure``), and the first step at which every answer is well formed (1-2
digits, an optional minus, then EOS) and at least ``TARGET_ACCURACY`` of them are right
ends the warm-up. GRPO then has both reward variance within groups and room to improve.

Why measured and not a fixed step count: CPU kernels round differently from one instruction
set to another (torch's AVX-512, AVX2 and default kernels), so a fixed number of steps ends
at another point of a noisy curve on every machine (150 steps gave 0.38 with AVX2, 0.345 with
one malformed answer in 200 with AVX-512). Measured on this recipe (seed 0), the rule stops at
step 147 (0.405 right) with AVX-512, 140 (0.395) with AVX2 and 149 (0.40) with the default
kernels; on an Intel Xeon @ 2.50GHz at step 140 (0.43), 142 (0.5) and 142 (0.385): the step that
crosses the target can overshoot it by 0.12. A step takes ~40 ms on one core, a measurement ~15 ms.
Starting the measurements earlier stops sooner at a similar accuracy (step 132 with AVX-512) but
from a model that GRPO improved less in the quickstart (0.735 instead of 0.79 at step 120 on one
AVX-512 machine).

Deterministic given the seed on one machine: seeded data and init, one torch thread while
it runs (a multi-threaded CPU matmul may sum in another order with another thread
count), the caller's RNG state and thread count restored afterwards.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from megarl.data.demo_data import PROBLEMS, answer, generate_rows, make_prompt_text

logger = logging.getLogger(__name__)

# Changing any value below changes the demo model: bump megarl.data.demo.MODEL_VERSION.
TARGET_ACCURACY = 0.38  # greedy accuracy on the 200 problems at which the warm-up stops (see the module docstring)
MIN_STEPS = 140  # optimizer steps before the first measurement (0.33-0.4 accuracy by then; the middle of the curve)
MAX_STEPS = 300  # a machine where the criterion is never met stops here (0.8-0.9 accuracy), with a warning
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


@dataclass(frozen=True)
class Measured:
    """Greedy answers of the demo model to the 200 problems: ``well_formed`` and ``right`` are
    fractions of the 200 (a right answer is well formed)."""

    well_formed: float
    right: float


@torch.no_grad()
def measure(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> Measured:
    """The greedy answers to every problem (at most 3 tokens: 2 digits or a minus and a digit, then
    EOS), judged against :func:`megarl.data.demo_data.answer`. Leaves the model's mode as it was."""
    training = model.training
    model.eval()
    prompts = torch.tensor([_prompt_ids(tokenizer, {"prompt": [{"role": "user", "content": make_prompt_text(*p)}]})
                            for p in PROBLEMS])  # [200, 7]: every demo prompt has 7 tokens
    sequence = prompts
    for _ in range(3):
        sequence = torch.cat([sequence, model(sequence).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    model.train(training)
    eos, well_formed, right = tokenizer.eos_token_id, 0, 0
    for problem, tokens in zip(PROBLEMS, sequence[:, prompts.shape[1]:].tolist()):
        if eos not in tokens:
            continue
        text = tokenizer.decode(tokens[: tokens.index(eos)])
        formed = re.fullmatch(r"-?\d{1,2}", text) is not None
        well_formed += formed
        right += formed and text == answer(*problem)
    return Measured(well_formed / len(PROBLEMS), right / len(PROBLEMS))


def reached_target(measured: Measured) -> bool:
    """The warm-up's stopping rule: every answer well formed and ``TARGET_ACCURACY`` of them right."""
    return measured.well_formed == 1.0 and measured.right >= TARGET_ACCURACY


def warm_up(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, max_steps: int = MAX_STEPS,
            seed: int = SEED, min_steps: int = MIN_STEPS) -> tuple[list[float], Measured]:
    """Train ``model`` in place until :func:`reached_target` (measured after every step from
    ``min_steps`` on) or ``max_steps`` steps; return the loss of each step (nats per answer token)
    and the last measurement. The model is left in eval mode."""
    rows = generate_rows("warmup", max_steps * BATCH, seed)
    measured: Measured | None = None

    def done(step: int) -> bool:
        nonlocal measured
        if step + 1 < min_steps:
            return False
        measured = measure(model, tokenizer)
        return reached_target(measured)

    losses = _train(model, *warmup_batch(tokenizer, rows), max_steps, seed, done)
    if measured is None or not reached_target(measured):
        measured = measured or measure(model, tokenizer)
        logger.warning("demo model warm-up: %d steps did not reach its target (all answers well formed, %.2f right): "
                       "%.3f well formed, %.3f right", len(losses), TARGET_ACCURACY, measured.well_formed, measured.right)
    return losses, measured


def warm_up_tools(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, steps: int = TOOL_STEPS,
                  seed: int = SEED) -> list[float]:
    """:func:`warm_up`'s recipe on the tool task (``tool_warmup_batch``) for a fixed ``steps``:
    ``TOOL_CALL_FRACTION`` of the rows call the calculator. ``tokenizer``: the tool variant (``build_demo_tokenizer(with_tools=True)``)."""
    from megarl.data.demo_tool_data import TOOL_CALL_FRACTION, generate_tool_rows

    rows = generate_tool_rows("warmup", steps * BATCH, seed)
    calls = (np.random.Generator(np.random.PCG64(seed)).random(len(rows)) < TOOL_CALL_FRACTION).tolist()
    return _train(model, *tool_warmup_batch(tokenizer, rows, calls), steps, seed)


def _train(model: PreTrainedModel, input_ids: torch.Tensor, labels: torch.Tensor, steps: int, seed: int,
           done: Callable[[int], bool] | None = None) -> list[float]:
    """At most ``steps`` steps of ``BATCH`` rows; ``done(step)`` (0-based, after the step) ends it early."""
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
                if done is not None and done(step):
                    break
        finally:
            torch.set_num_threads(threads)
            model.eval()
    return losses
