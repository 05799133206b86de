"""RLDataset items against hand-made rows with known token counts.

The demo tokenizer renders a user message as "<|user|>" + content + "<|assistant|>" and
makes every digit one token, so content "0123456789" is 12 tokens.
"""

import logging

import pytest
import torch

from conftest import chat, data_config, row
from megarl.data import DataError, RLDataset, collate_fn

DIGITS = "0123456789"


def tokens(tokenizer, *names: str) -> list[int]:
    return tokenizer.convert_tokens_to_ids(list(names))


def config(**overrides):
    cfg = {
        "prompt_key": "prompt",
        "max_prompt_length": 16,
        "truncation": "error",
        "filter_overlong_prompts": False,
        "return_raw_chat": False,
        "return_full_prompt": False,
        "reward_fn_key": "data_source",
    }
    cfg.update(overrides)
    return data_config(**cfg)


def test_item_is_left_padded_with_positions(tokenizer, write_rows):
    path = write_rows([row("123", 0)])
    item = RLDataset([path], tokenizer, config(max_prompt_length=8))[0]
    pad = tokenizer.pad_token_id
    assert item["input_ids"].tolist() == [pad] * 3 + tokens(tokenizer, "<|user|>", "1", "2", "3", "<|assistant|>")
    assert item["attention_mask"].tolist() == [0, 0, 0, 1, 1, 1, 1, 1]
    assert item["position_ids"].tolist() == [0, 0, 0, 0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("left", ["5", "6", "7", "8", "9", "<|assistant|>"]),
        ("right", ["<|user|>", "0", "1", "2", "3", "4"]),
        ("middle", ["<|user|>", "0", "1", "8", "9", "<|assistant|>"]),
    ],
)
def test_truncation_modes(tokenizer, write_rows, mode, expected):
    path = write_rows([row(DIGITS, 0)])
    item = RLDataset([path], tokenizer, config(max_prompt_length=6, truncation=mode))[0]
    assert item["input_ids"].tolist() == tokens(tokenizer, *expected)
    assert item["attention_mask"].tolist() == [1] * 6


def test_truncation_error_names_file_row_column(tokenizer, write_rows):
    path = write_rows([row("1", 0), row(DIGITS, 1)])
    dataset = RLDataset([path], tokenizer, config(max_prompt_length=11))
    dataset[0]
    with pytest.raises(DataError) as info:
        dataset[1]
    message = str(info.value)
    assert path in message and "row 1" in message and "'prompt'" in message and "12 tokens" in message


def test_filter_overlong_drops_rows_and_logs(tokenizer, write_rows, caplog):
    # token counts: 5, 12, 7 ("1 2" = 1, Ġ, 2)
    path = write_rows([row("123", 0), row(DIGITS, 1), row("1 2 3", 2)])
    with caplog.at_level(logging.WARNING, logger="megarl.data.dataset"):
        dataset = RLDataset([path], tokenizer, config(max_prompt_length=8, filter_overlong_prompts=True))
    assert len(dataset) == 2
    assert [dataset[i]["extra_info"]["index"] for i in range(2)] == [0, 2]
    assert "dropped 1 of 3" in caplog.text


def test_filter_overlong_dropping_everything_is_an_error(tokenizer, write_rows):
    path = write_rows([row(DIGITS, 0)])
    with pytest.raises(DataError, match="dropped every row"):
        RLDataset([path], tokenizer, config(max_prompt_length=4, filter_overlong_prompts=True))


def test_non_tensor_fields(tokenizer, write_rows):
    rows = [
        {"source": "a", "prompt": chat("1"), "reward_model": {"ground_truth": "1"}, "extra_info": {"split": "x"}},
        {"source": "b", "prompt": chat("2"), "reward_model": {"ground_truth": "2"}, "extra_info": None},
    ]
    path = write_rows(rows)
    dataset = RLDataset(
        [path], tokenizer, config(reward_fn_key="source", return_raw_chat=True, return_full_prompt=True)
    )
    first, second = dataset[0], dataset[1]
    assert first["data_source"] == "a" and second["data_source"] == "b"
    assert first["reward_model"] == {"ground_truth": "1"}
    assert first["extra_info"] == {"split": "x", "index": 0}
    assert second["extra_info"] == {"index": 1}
    assert first["raw_prompt"] == chat("1")
    assert first["full_prompts"] == "<|user|>1<|assistant|>"
    assert "prompt" not in first


def test_without_raw_chat_flags_those_keys_are_absent(tokenizer, write_rows):
    item = RLDataset([write_rows([row("1", 0)])], tokenizer, config())[0]
    assert "raw_prompt" not in item and "full_prompts" not in item


def test_several_files_and_collate(tokenizer, write_rows):
    a = write_rows([row("1", 0, "1"), row("22", 1, "2")], "a.parquet")
    b = write_rows([row("333", 0, "3")], "b.parquet")
    dataset = RLDataset([a, b], tokenizer, config(max_prompt_length=6))
    assert len(dataset) == 3 and dataset.origins == [(a, 0), (a, 1), (b, 0)]
    batch = collate_fn([dataset[i] for i in range(3)])
    assert batch.batch["input_ids"].shape == (3, 6) and batch.batch["input_ids"].dtype == torch.long
    assert batch.batch["attention_mask"].sum(1).tolist() == [3, 4, 5]
    assert [rm["ground_truth"] for rm in batch.non_tensor_batch["reward_model"]] == ["1", "2", "3"]
    assert [e["index"] for e in batch.non_tensor_batch["extra_info"]] == [0, 1, 0]  # from the rows
    assert list(batch.non_tensor_batch["data_source"]) == ["src"] * 3
