"""The reward model's input rows (megarl.reward.rm_inputs) against hand-built expectations.

Actor tokenizer: the demo tokenizer (template `<|role|>content`, assistant turns end in `<eos>`).
A reward model with the same tokenizer reads the rollout's own tokens; one with another chat
template gets the chat re-rendered with its template, the actor's `<eos>` text dropped from the
response, its own BOS text not doubled. Inputs longer than the max length keep their last tokens.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from megarl.data.demo_tokenizer import build_demo_tokenizer
from megarl.protocol import DataProto
from megarl.reward.rm_inputs import rm_inputs

CHATS = [[{"role": "user", "content": "1+2"}], [{"role": "system", "content": "9"}, {"role": "user", "content": "3+4"}]]
ANSWERS = ["3", "-7"]
P, R = 12, 4


@pytest.fixture(scope="module")
def actor_tok():
    return build_demo_tokenizer()


def rollout(tok) -> DataProto:
    """Left-padded rendered prompts + right-padded responses (answer + <eos>), as the rollout returns them."""
    prompts, responses = [], []
    for chat, answer in zip(CHATS, ANSWERS):
        prompts.append(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False))
        responses.append(tok(answer)["input_ids"] + [tok.eos_token_id])
    ids = torch.zeros(len(CHATS), P + R, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids[i, P - len(p): P], mask[i, P - len(p): P] = torch.tensor(p), 1
        ids[i, P: P + len(r)], mask[i, P: P + len(r)] = torch.tensor(r), 1
    batch = DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "responses": ids[:, P:],
                                 "response_mask": mask[:, P:]})
    batch.non_tensor_batch["raw_prompt"] = np.array(CHATS + [None], dtype=object)[:-1]
    return batch, prompts, responses


def _rows(out: DataProto) -> list[list[int]]:
    return [ids[m.bool()].tolist() for ids, m in zip(out.batch["input_ids"], out.batch["attention_mask"])]


def test_same_tokenizer_reads_the_rollout_tokens_and_truncates_from_the_left(actor_tok):
    batch, prompts, responses = rollout(actor_tok)
    out, ratio = rm_inputs(batch, actor_tok, copy.deepcopy(actor_tok), max_length=64)
    assert _rows(out) == [p + r for p, r in zip(prompts, responses)] and ratio == 0.0
    assert out.batch["position_ids"][0, : len(prompts[0]) + len(responses[0])].tolist() == list(range(len(prompts[0]) + len(responses[0])))
    shortest = min(len(p) + len(r) for p, r in zip(prompts, responses))
    out, ratio = rm_inputs(batch, actor_tok, actor_tok, max_length=shortest)  # cuts the longer row only
    assert _rows(out) == [(p + r)[-shortest:] for p, r in zip(prompts, responses)]
    assert ratio == 0.5 and out.batch["input_ids"].shape[1] == shortest


def test_other_chat_template_re_renders_the_chat(actor_tok):
    rm_tok = copy.deepcopy(actor_tok)
    rm_tok.chat_template = "{{ '<pad>' }}{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + ' ' }}{% endfor %}"
    rm_tok.bos_token = "<pad>"  # its template starts with the BOS text: dropped (tokenizing adds its BOS, here none)
    batch, _, _ = rollout(actor_tok)
    out, ratio = rm_inputs(batch, actor_tok, rm_tok, max_length=64)
    # the response without the actor's <eos>, no generation prompt
    want = ["<|user|>1+2 <|assistant|>3 ", "<|system|>9 <|user|>3+4 <|assistant|>-7 "]
    assert _rows(out) == [rm_tok(text)["input_ids"] for text in want] and ratio == 0.0
    del batch.non_tensor_batch["raw_prompt"]
    with pytest.raises(ValueError, match="data.return_raw_chat=true"):
        rm_inputs(batch, actor_tok, rm_tok, max_length=64)
