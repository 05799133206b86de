"""create_dataloader: batching, seeded shuffle, resume mid-epoch, val, custom_cls."""

import pytest

from conftest import data_config, row
from megarl.config.read import to_dict
from megarl.data import DataError, create_dataloader
from megarl.protocol import DataProto


@pytest.fixture
def cfg(write_rows):
    train = write_rows([row(str(i % 10), i) for i in range(10)], "train.parquet")
    val = write_rows([row(str(i), i) for i in range(5)], "val.parquet")
    return data_config(train_files=train, val_files=[val], max_prompt_length=8, truncation="error",
                       train_batch_size=3, val_batch_size=None, shuffle=True, seed=7)


def changed(cfg, **values):
    """A copy of `cfg` with `values` set."""
    return data_config(**{**to_dict(cfg), **values})


def indices(batch: DataProto) -> list[int]:
    return [e["index"] for e in batch.non_tensor_batch["extra_info"]]


def run_epochs(loader, epochs: int) -> list[list[int]]:
    return [indices(b) for _ in range(epochs) for b in loader]


def test_train_batches_shuffle_and_drop_last(cfg, tokenizer):
    loader = create_dataloader(cfg, tokenizer, "train")
    assert len(loader) == 3  # 10 // 3, the short batch is dropped
    epoch0, epoch1 = [indices(b) for b in loader], [indices(b) for b in loader]
    assert len(epoch0) == 3 and all(len(b) == 3 for b in epoch0)
    flat0 = sum(epoch0, [])
    assert len(set(flat0)) == 9 and flat0 != sorted(flat0)  # no repeats, shuffled
    assert epoch0 != epoch1  # a new permutation each epoch
    again = create_dataloader(cfg, tokenizer, "train")
    assert [indices(b) for b in again] == epoch0  # same seed, same order
    other = create_dataloader(changed(cfg, seed=8), tokenizer, "train")
    assert [indices(b) for b in other] != epoch0


def test_no_shuffle_keeps_file_order(cfg, tokenizer):
    loader = create_dataloader(changed(cfg, shuffle=False), tokenizer, "train")
    assert [indices(b) for b in loader] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


@pytest.mark.parametrize("consumed", [0, 1, 2, 3, 4])
def test_resume_sees_the_same_remaining_prompts(cfg, tokenizer, consumed):
    reference = run_epochs(create_dataloader(cfg, tokenizer, "train"), 3)

    first = create_dataloader(cfg, tokenizer, "train")
    seen, it = [], iter(first)
    for _ in range(consumed):
        try:
            seen.append(indices(next(it)))
        except StopIteration:  # epoch boundary: start the next epoch's iterator
            it = iter(first)
            seen.append(indices(next(it)))
    state = first.state_dict()

    resumed = create_dataloader(cfg, tokenizer, "train")
    resumed.load_state_dict(state)
    rest = run_epochs(resumed, 3)
    assert seen + rest[: len(reference) - len(seen)] == reference


def test_val_is_one_batch_in_order_when_val_batch_size_is_null(cfg, tokenizer):
    loader = create_dataloader(cfg, tokenizer, "val")
    batches = list(loader)
    assert len(batches) == 1 and indices(batches[0]) == [0, 1, 2, 3, 4]
    loader = create_dataloader(changed(cfg, val_batch_size=2), tokenizer, "val")
    assert [indices(b) for b in loader] == [[0, 1], [2, 3], [4]]  # last short batch kept


def test_batch_size_errors(cfg, tokenizer):
    with pytest.raises(DataError, match="data.train_batch_size=11 exceeds the 10 training prompts"):
        create_dataloader(changed(cfg, train_batch_size=11), tokenizer, "train")
    with pytest.raises(DataError, match="data.train_batch_size must be a positive int"):
        create_dataloader(changed(cfg, train_batch_size=0), tokenizer, "train")
    with pytest.raises(ValueError, match="split must be one of"):
        create_dataloader(cfg, tokenizer, "test")


CUSTOM = '''
from torch.utils.data import Dataset
from megarl.data import RLDataset

class TaggedDataset(RLDataset):
    def __getitem__(self, index):
        item = super().__getitem__(index)
        item["tag"] = "custom"
        return item

NOT_A_DATASET = 3
'''


def test_custom_cls_is_loaded_from_file(cfg, tokenizer, tmp_path):
    path = tmp_path / "my_data.py"
    path.write_text(CUSTOM)
    loader = create_dataloader(changed(cfg, custom_cls={"path": str(path), "name": "TaggedDataset"}), tokenizer, "val")
    assert list(next(iter(loader)).non_tensor_batch["tag"]) == ["custom"] * 5


@pytest.mark.parametrize(
    "custom, message",
    [
        ({"path": "/no/such/file.py", "name": "X"}, "data.custom_cls.path='/no/such/file.py': file not found"),
        ({"path": "{file}", "name": None}, "data.custom_cls.name is not set"),
        ({"path": "{file}", "name": "Missing"}, "data.custom_cls.name='Missing': no such attribute"),
        ({"path": "{file}", "name": "NOT_A_DATASET"}, "is not a torch.utils.data.Dataset subclass"),
        ({"path": None, "name": "TaggedDataset"}, "data.custom_cls.path is not"),
    ],
)
def test_custom_cls_errors_name_the_key(cfg, tokenizer, tmp_path, custom, message):
    path = tmp_path / "my_data.py"
    path.write_text(CUSTOM)
    custom = {k: (v.format(file=path) if isinstance(v, str) else v) for k, v in custom.items()}
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(".", r"\.")):
        create_dataloader(changed(cfg, custom_cls=custom), tokenizer, "val")

