"""Every kind of bad data fails with a DataError naming the file, row and column."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import chat, data_config, row
from megarl.data import DataError, RLDataset, create_dataloader

CFG = {"prompt_key": "prompt", "max_prompt_length": 16, "truncation": "error", "reward_fn_key": "data_source"}


def load(path, tokenizer, **overrides):
    return RLDataset([str(path)], tokenizer, data_config(**{**CFG, **overrides}))


def test_missing_file(tokenizer, tmp_path):
    path = tmp_path / "nope.parquet"
    with pytest.raises(DataError, match=f"{path}: file not found"):
        load(path, tokenizer)


def test_empty_file(tokenizer, tmp_path):
    path = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
                             "data_source": pa.array([], pa.string())}), str(path))
    with pytest.raises(DataError, match=f"{path}: file has no rows"):
        load(path, tokenizer)


def test_corrupt_file(tokenizer, tmp_path):
    path = tmp_path / "corrupt.parquet"
    path.write_bytes(b"PAR1 this is not really parquet")
    with pytest.raises(DataError, match=f"{path}: cannot read parquet"):
        load(path, tokenizer)


def test_missing_prompt_column(tokenizer, write_rows):
    path = write_rows([{"question": "hi", "data_source": "s"}])
    with pytest.raises(DataError, match=r"column 'prompt': column missing; the file has \['question', 'data_source'\]"):
        load(path, tokenizer)
    assert path in str(pytest.raises(DataError, load, path, tokenizer).value)


def test_missing_reward_fn_key_column(tokenizer, write_rows):
    path = write_rows([{"prompt": chat("1")}])
    with pytest.raises(DataError, match="column 'data_source': column missing"):
        load(path, tokenizer)


def test_prompt_not_a_list_of_messages(tokenizer, write_rows):
    path = write_rows([{"prompt": "1", "data_source": "s"}, {"prompt": "plain text", "data_source": "s"}])
    with pytest.raises(DataError, match=f"{path}, row 0, column 'prompt': expected a non-empty list of chat messages, got str"):
        load(path, tokenizer)


def test_message_without_content(tokenizer, write_rows):
    path = write_rows([row("1", 0), {"prompt": [{"role": "user"}], "data_source": "s", "extra_info": {"index": 1},
                                     "reward_model": {"style": "rule", "ground_truth": "1"}}])
    with pytest.raises(DataError, match=f"{path}, row 1, column 'prompt': each message must be a dict"):
        load(path, tokenizer)


def test_empty_message_list(tokenizer, write_rows):
    path = write_rows([{"prompt": [], "data_source": "s"}])
    with pytest.raises(DataError, match="row 0, column 'prompt'"):
        load(path, tokenizer)


def test_chat_template_failure_names_the_row(tokenizer, write_rows):
    path = write_rows([row("1", 0), {**row("2", 1), "prompt": [{"role": "tool", "content": "2"}]}])
    dataset = load(path, tokenizer)
    with pytest.raises(DataError, match=f"{path}, row 1, column 'prompt': chat template failed"):
        dataset[1]


def test_bad_truncation_value(tokenizer, write_rows):
    with pytest.raises(DataError, match="data.truncation=.sideways. is not a truncation mode; fix: use one of error, left"):
        load(write_rows([row("1", 0)]), tokenizer, truncation="sideways")


def test_unset_files_key(tokenizer):
    with pytest.raises(DataError, match="data.val_files is not set"):
        create_dataloader(data_config(**{**CFG, "val_files": None}), tokenizer, "val")
