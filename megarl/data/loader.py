"""``create_dataloader``: the data config -> a resumable DataProto loader.

Data config keys read here: train_files, val_files, train_batch_size, val_batch_size,
shuffle, seed, custom_cls.{path,name} (plus the dataset's keys, see ``dataset.py``).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any, Mapping

from torch.utils.data import Dataset
from transformers import PreTrainedTokenizerBase

from megarl.data.collate import collate_fn
from megarl.data.dataset import RLDataset
from megarl.data.errors import DataError
from megarl.data.parquet_io import as_file_list
from megarl.data.sampler import ResumableSampler, RLDataLoader

SPLITS = ("train", "val")


def load_custom_dataset_class(path: str, name: str | None) -> type:
    """The class ``name`` defined in the Python file ``path`` (``data.custom_cls``)."""
    if not name:
        raise DataError(f"data.custom_cls.name is not set (data.custom_cls.path={path!r}); name the Dataset class")
    path = os.path.expanduser(path)
    if not os.path.isfile(path):
        raise DataError(f"data.custom_cls.path={path!r}: file not found")
    spec = importlib.util.spec_from_file_location(f"megarl_custom_dataset_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise DataError(f"data.custom_cls.path={path!r}: importing it failed: {type(exc).__name__}: {exc}") from exc
    cls = getattr(module, name, None)
    if cls is None:
        raise DataError(f"data.custom_cls.name={name!r}: no such attribute in {path}")
    if not (isinstance(cls, type) and issubclass(cls, Dataset)):
        raise DataError(f"data.custom_cls.name={name!r} in {path} is not a torch.utils.data.Dataset subclass")
    return cls


def create_dataset(data_cfg: Mapping[str, Any], tokenizer: PreTrainedTokenizerBase, split: str) -> Dataset:
    """The dataset of ``split``: ``RLDataset`` or ``data.custom_cls``, called as
    ``cls(data_files=[...], tokenizer=tokenizer, config=data_cfg)``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    files_key = f"{split}_files"
    files = as_file_list(data_cfg.get(files_key), f"data.{files_key}")
    custom = data_cfg.get("custom_cls") or {}
    dataset_cls = RLDataset
    if custom.get("path"):
        dataset_cls = load_custom_dataset_class(custom["path"], custom.get("name"))
    elif custom.get("name"):
        raise DataError(f"data.custom_cls.name={custom['name']!r} is set but data.custom_cls.path is not")
    return dataset_cls(data_files=files, tokenizer=tokenizer, config=data_cfg)


def create_dataloader(data_cfg: Mapping[str, Any], tokenizer: PreTrainedTokenizerBase, split: str) -> RLDataLoader:
    """A resumable loader over ``split``.

    train: ``data.train_batch_size`` prompts per batch, short last batch dropped,
    shuffled (``data.shuffle``) with seed ``data.seed``.
    val: ``data.val_batch_size`` prompts per batch (null = the whole set at once), in
    file order, nothing dropped.
    """
    dataset = create_dataset(data_cfg, tokenizer, split)
    if split == "train":
        batch_size = data_cfg.get("train_batch_size")
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise DataError(f"data.train_batch_size must be a positive int, got {batch_size!r}")
        if batch_size > len(dataset):
            raise DataError(
                f"data.train_batch_size={batch_size} exceeds the {len(dataset)} training prompts; "
                "no full batch can be formed"
            )
        shuffle = bool(data_cfg.get("shuffle", True))
        drop_last = True
    else:
        batch_size = data_cfg.get("val_batch_size") or len(dataset)
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise DataError(f"data.val_batch_size must be a positive int or null, got {batch_size!r}")
        shuffle = False
        drop_last = False
    seed = data_cfg.get("seed")
    sampler = ResumableSampler(len(dataset), shuffle=shuffle, seed=1 if seed is None else int(seed))
    return RLDataLoader(dataset, batch_size, sampler, collate_fn, drop_last=drop_last)
