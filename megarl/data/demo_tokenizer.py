"""The demo tokenizer: byte-level BPE trained on the demo task's text, exactly 64 entries.

It uses Qwen2's tokenizer pipeline (NFC, Qwen2's split regex, byte-level BPE, byte-level
decoder) because transformers loads any tokenizer saved next to a ``qwen2`` config as
``Qwen2Tokenizer``, which rebuilds that pipeline from the vocab and merges: with the same
pipeline, the tokenizer we train and the one transformers or vLLM load are identical.

Layout (ids): special tokens first (``<pad>``, ``<eos>``, ``<unk>``, role markers), then the
byte-level symbols and merges learned by ``BpeTrainer`` on the task text, then
``<reserved_k>`` fillers up to ``VOCAB_SIZE`` so that the model's vocabulary equals
``len(tokenizer)``. Every digit and the minus sign are their own tokens and spaces are
kept, so a decoded response reads like ``"-2"``; characters the task never uses are dropped
on encoding.

The tool variant (``with_tools=True``, the model of the demo's tool task,
``megarl.data.demo_tool_data``) gives the last six reserved ids to the tool-call markup, one
token each: ``<tool_call>``, ``</tool_call>``, ``<tool_response>``, ``</tool_response>`` and the
JSON around a calculator expression (``CALL_OPEN`` / ``CALL_CLOSE``). They are plain (not
special) tokens, so decoding keeps them and the hermes parser (``megarl.agent.tool_parser``)
reads the call; its chat template renders a tool message as ``<tool_response>...</tool_response>``.
"""

from __future__ import annotations

import json

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from megarl.data.demo_data import task_corpus
from megarl.data.demo_tool_data import CALL_CLOSE, CALL_OPEN

VOCAB_SIZE = 64
PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
ROLES = ("system", "user", "assistant")
SPECIAL_TOKENS = [PAD_TOKEN, EOS_TOKEN, UNK_TOKEN] + [f"<|{role}|>" for role in ROLES]
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", CALL_OPEN, CALL_CLOSE]

# transformers' Qwen2Tokenizer.PRETOKENIZE_REGEX (digits split one by one).
QWEN2_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Role marker, then the content; an assistant turn ends with <eos>.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('demo chat template supports roles system/user/assistant, got ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ '<eos>' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
# The tool variant: a tool message is the model's next input, wrapped in <tool_response> (hermes).
TOOL_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}{{ '<tool_response>' + message['content'] + '</tool_response>' }}"
    "{% elif message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('demo chat template supports roles system/user/assistant/tool, got ' + message['role']) }}"
    "{% else %}{{ '<|' + message['role'] + '|>' + message['content'] }}{% endif %}"
    "{% if message['role'] == 'assistant' %}{{ '<eos>' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def _qwen2_pipeline(model: models.Model) -> Tokenizer:
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def build_demo_tokenizer(with_tools: bool = False) -> PreTrainedTokenizerFast:
    """Train the BPE on the task text, pad it to ``VOCAB_SIZE`` and wrap it for transformers;
    ``with_tools``: the tool variant (module docstring; the same ids for every other token)."""
    trained = _qwen2_pipeline(models.BPE())
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, min_frequency=1, show_progress=False
    )
    trained.train_from_iterator(task_corpus(), trainer=trainer)
    trained_json = trained.to_str()
    model_json = json.loads(trained_json)["model"]
    vocab: dict[str, int] = model_json["vocab"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model_json["merges"]]
    if len(vocab) > VOCAB_SIZE:
        raise RuntimeError(f"demo task text needs {len(vocab)} tokens, more than VOCAB_SIZE={VOCAB_SIZE}")
    ordered = sorted(vocab, key=vocab.__getitem__)
    tool_tokens = TOOL_TOKENS if with_tools else []
    reserved = [f"<reserved_{k}>" for k in range(VOCAB_SIZE - len(ordered) - len(tool_tokens))]
    full_vocab = {token: i for i, token in enumerate(ordered + reserved)}

    tokenizer = _qwen2_pipeline(models.BPE(vocab=full_vocab, merges=merges))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in tool_tokens])
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=128,
    )
    wrapped.chat_template = TOOL_CHAT_TEMPLATE if with_tools else CHAT_TEMPLATE
    if len(wrapped) != VOCAB_SIZE:
        raise RuntimeError(f"demo tokenizer has {len(wrapped)} entries, expected {VOCAB_SIZE}")
    return wrapped
