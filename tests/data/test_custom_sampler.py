"""data.sampler: the user's torch Sampler decides the order, resumes, and bad ones fail clearly."""

import pytest

from conftest import data_config, row
from megarl.config.read import to_dict
from megarl.data import DataError, create_dataloader

SAMPLERS = '''
from torch.utils.data import Sampler

class Reversed(Sampler):
    """Dataset indices backwards; every second epoch forwards (set_epoch)."""
    def __init__(self, data_source, data_config):
        self.n, self.epoch = len(data_source), 0
        self.seen_config = data_config["train_batch_size"]
    def set_epoch(self, epoch):
        self.epoch = epoch
    def __iter__(self):
        order = list(range(self.n))
        return iter(order[::-1] if self.epoch % 2 == 0 else order)
    def __len__(self):
        return self.n

class Curriculum(Reversed):
    def update(self, batch):
        pass

class OutOfRange(Reversed):
    def __iter__(self):
        return iter([0, 99])

NOT_A_SAMPLER = 3
'''


@pytest.fixture
def cfg(write_rows, tmp_path):
    (tmp_path / "samplers.py").write_text(SAMPLERS)
    return data_config(
        train_files=write_rows([row(str(i % 10), i) for i in range(7)], "train.parquet"),
        max_prompt_length=8, truncation="error", train_batch_size=2, shuffle=True, seed=7,
        sampler={"class_path": str(tmp_path / "samplers.py"), "class_name": "Reversed"},
    )


def order(loader) -> list[int]:
    return [e["index"] for b in loader for e in b.non_tensor_batch["extra_info"]]


def test_custom_sampler_order_is_used_per_epoch(cfg, tokenizer):
    loader = create_dataloader(cfg, tokenizer, "train")
    assert order(loader) == [6, 5, 4, 3, 2, 1]  # 7 rows, batches of 2, short batch dropped
    assert order(loader) == [0, 1, 2, 3, 4, 5]  # epoch 1: set_epoch(1) -> forwards


def test_custom_sampler_resumes_mid_epoch(cfg, tokenizer):
    first = create_dataloader(cfg, tokenizer, "train")
    it = iter(first)
    next(it)
    state = first.state_dict()
    resumed = create_dataloader(cfg, tokenizer, "train")
    resumed.load_state_dict(state)
    assert order(resumed) == [4, 3, 2, 1]
    assert order(resumed) == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    "name, message",
    [
        ("Curriculum", "has an update(batch) method"),
        ("NOT_A_SAMPLER", "is not a torch.utils.data.Sampler subclass"),
        ("Missing", "data.sampler.class_name='Missing': no such attribute"),
        ("OutOfRange", "yielded index 99 outside the dataset of 7 rows"),
    ],
)
def test_bad_sampler_names_the_key(cfg, tokenizer, name, message):
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")) as info:
        sampler = {"class_path": cfg.sampler.class_path, "class_name": name}
        loader = create_dataloader(data_config(**{**to_dict(cfg), "sampler": sampler}), tokenizer, "train")
        order(loader)
    assert info.value.key == "data.sampler.class_name"
