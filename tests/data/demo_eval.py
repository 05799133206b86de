"""Greedy answers of a demo model to all 200 problems, checked against arithmetic done here."""

from __future__ import annotations

import torch

from megarl.data.demo_data import PROBLEMS, make_prompt_text

MAX_NEW_TOKENS = 4  # the yaml's data.max_response_length


def prompt_ids(tokenizer, texts: list[str]) -> torch.Tensor:
    """``[N, 7]`` chat-templated prompt ids (every demo prompt has 7 tokens)."""
    chats = [[{"role": "user", "content": t}] for t in texts]
    rendered = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
    return torch.tensor([tokenizer(r, add_special_tokens=False)["input_ids"] for r in rendered])


def true_answer(a: int, op: str, b: int) -> str:
    return str(a + b if op == "+" else a - b)


@torch.no_grad()
def greedy_answers(model, tokenizer) -> list[list[int]]:
    """Each problem's greedy response tokens, up to and including EOS (at most 4 tokens)."""
    seq = prompt_ids(tokenizer, [make_prompt_text(*p) for p in PROBLEMS])
    start = seq.shape[1]
    for _ in range(MAX_NEW_TOKENS):
        seq = torch.cat([seq, model(seq).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    eos = tokenizer.eos_token_id
    responses = []
    for row in seq[:, start:].tolist():
        responses.append(row[: row.index(eos) + 1] if eos in row else row)
    return responses


def greedy_accuracy(model, tokenizer) -> float:
    """Fraction of the 200 problems whose greedy response is the right answer, then EOS."""
    right = 0
    for problem, response in zip(PROBLEMS, greedy_answers(model, tokenizer)):
        ends = response[-1:] == [tokenizer.eos_token_id]
        right += ends and tokenizer.decode(response[:-1]) == true_answer(*problem)
    return right / len(PROBLEMS)
