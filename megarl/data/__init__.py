"""Parquet RL prompts -> DataProto batches, and the embedded demo task (``demo``)."""

from megarl.data.collate import collate_fn
from megarl.data.dataset import RLDataset, left_pad
from megarl.data.errors import DataError
from megarl.data.loader import create_dataloader, create_dataset, load_custom_dataset_class
from megarl.data.sampler import ResumableSampler, RLDataLoader
from megarl.data.truncation import TRUNCATION_MODES, truncate_prompt

__all__ = [
    "DataError",
    "RLDataLoader",
    "RLDataset",
    "ResumableSampler",
    "TRUNCATION_MODES",
    "collate_fn",
    "create_dataloader",
    "create_dataset",
    "left_pad",
    "load_custom_dataset_class",
    "truncate_prompt",
]
