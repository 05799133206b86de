"""The reward model's input rows for a rollout batch (driver side).

When the reward model renders text as the actor does (same vocabulary, same chat template), its
input is the rollout's own tokens. Otherwise, as verl's reward loop: the row's chat
(`raw_prompt`, data.return_raw_chat) plus the decoded response (the actor's EOS text removed) as
an assistant turn, rendered with the reward model's chat template (no generation prompt; a
leading BOS text dropped) and tokenized by its tokenizer with its special tokens.

Truncation: an input longer than `max_length` keeps its LAST `max_length` tokens: the response
end, where the score is read, survives; the start of the prompt is cut. The share of rows cut is
returned (the trainer logs it as `reward_model/truncated_ratio`).
"""

from __future__ import annotations

from typing import Any

import torch

from megarl.protocol import DataProto

__all__ = ["rm_inputs", "same_rendering"]


def same_rendering(actor_tokenizer: Any, rm_tokenizer: Any) -> bool:
    """Whether the reward model reads the actor's token ids as the same text (vocabulary and chat template)."""
    return (actor_tokenizer.chat_template == rm_tokenizer.chat_template
            and actor_tokenizer.get_vocab() == rm_tokenizer.get_vocab())


def _rendered_rows(batch: DataProto, actor_tokenizer: Any, rm_tokenizer: Any) -> list[list[int]]:
    if "raw_prompt" not in batch.non_tensor_batch:
        raise ValueError("the reward model's tokenizer or chat template differs from the actor's, so its input is "
                         "rendered from each row's chat: set data.return_raw_chat=true")
    responses = batch.batch["responses"]
    lengths = batch.batch["attention_mask"][:, -responses.shape[1]:].sum(-1).tolist()
    eos = actor_tokenizer.eos_token
    bos = rm_tokenizer.bos_token
    rows = []
    for chat, ids, n in zip(batch.non_tensor_batch["raw_prompt"], responses, lengths):
        text = actor_tokenizer.decode(ids[: int(n)].tolist())
        if eos:
            text = text.replace(eos, "")
        rendered = rm_tokenizer.apply_chat_template([*list(chat), {"role": "assistant", "content": text}],
                                                    add_generation_prompt=False, tokenize=False)
        if bos and rendered.startswith(bos):  # tokenizing with special tokens adds it back once
            rendered = rendered[len(bos):]
        rows.append(rm_tokenizer(rendered, add_special_tokens=True)["input_ids"])
    return rows


def rm_inputs(batch: DataProto, actor_tokenizer: Any, rm_tokenizer: Any, max_length: int) -> tuple[DataProto, float]:
    """The reward model's rows for `batch` (left-padded prompts + right-padded responses).

    Returns:
        (`input_ids` / `attention_mask` / `position_ids` `[B, L]` right-padded, L the longest row
        after truncation to `max_length`; the share of rows truncated).
    """
    mask = batch.batch["attention_mask"].bool()
    if same_rendering(actor_tokenizer, rm_tokenizer):
        rows = [ids[m].tolist() for ids, m in zip(batch.batch["input_ids"], mask)]
    else:
        rows = _rendered_rows(batch, actor_tokenizer, rm_tokenizer)
    truncated = sum(len(r) > max_length for r in rows)
    rows = [r[-max_length:] for r in rows]
    length = max(len(r) for r in rows)
    input_ids = torch.zeros(len(rows), length, dtype=torch.long)
    attention_mask = torch.zeros(len(rows), length, dtype=torch.long)
    for i, r in enumerate(rows):
        input_ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        attention_mask[i, : len(r)] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    out = DataProto.from_dict({"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids})
    return out, truncated / max(len(rows), 1)
