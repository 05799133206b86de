"""``create_dataloader``: the data config -> a resumable DataProto loader.

The data config is the typed ``data`` section (``DataConfig``); a custom dataset class or sampler
gets it as verl passes it, a DictConfig. Keys read here: train_files, val_files,
train_max_samples, val_max_samples, train_batch_size, val_batch_size, shuffle, seed,
validation_shuffle, custom_cls.{path,name}, sampler.{class_path,class_name} (plus the
dataset's keys, see ``dataset.py``).
"""

from __future__ import annotations

import importlib.util
import os

from omegaconf import DictConfig, OmegaConf
from torch.utils.data import Dataset, Sampler
from transformers import PreTrainedTokenizerBase

from megarl.config.read import to_dict
from megarl.config.schema.data import DataConfig

from megarl.data.collate import collate_fn
from megarl.data.dataset import RLDataset
from megarl.data.errors import DataError
from megarl.data.parquet_io import as_file_list
from megarl.data.sampler import ClassSampler, ResumableSampler, RLDataLoader, data_seed

SPLITS = ("train", "val")


def load_class(path: str | None, name: str | None, keys: tuple[str, str], base: type) -> type:
    """The class ``name`` defined in the Python file ``path``; it must subclass ``base``.

    keys: the config keys of (path, name), named in every error (e.g.
    ``("data.custom_cls.path", "data.custom_cls.name")``).
    """
    path_key, name_key = keys
    if not path:
        raise DataError(f"{name_key}={name!r} is set but {path_key} is not", key=path_key,
                        fix=f"set {path_key} to the .py file defining it, or {name_key}=null")
    if not name:
        raise DataError(f"{name_key} is not set ({path_key}={path!r})", key=name_key,
                        fix=f"set {name_key} to the class name inside {path}")
    path = os.path.expanduser(path)
    if not os.path.isfile(path):
        raise DataError(f"{path_key}={path!r}: file not found", key=path_key, fix=f"point {path_key} at an existing .py file")
    spec = importlib.util.spec_from_file_location(f"megarl_custom_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise DataError(f"{path_key}={path!r}: importing it failed: {type(exc).__name__}: {exc}", key=path_key,
                        fix=f"fix the error in {path}") from exc
    cls = getattr(module, name, None)
    if cls is None:
        raise DataError(f"{name_key}={name!r}: no such attribute in {path}", key=name_key,
                        fix=f"set {name_key} to a class defined in {path}")
    if not (isinstance(cls, type) and issubclass(cls, base)):
        base_name = f"torch.utils.data.{base.__qualname__}" if base.__module__.startswith("torch.utils.data") else base.__qualname__
        raise DataError(f"{name_key}={name!r} in {path} is not a {base_name} subclass",
                        key=name_key, fix=f"derive {name} from {base_name}")
    return cls


def load_custom_dataset_class(path: str, name: str | None) -> type:
    """The class ``name`` defined in the Python file ``path`` (``data.custom_cls``)."""
    return load_class(path, name, ("data.custom_cls.path", "data.custom_cls.name"), Dataset)


def verl_data_config(data_cfg: DataConfig) -> DictConfig:
    """The ``data`` section as verl hands it to a custom dataset class or sampler (a DictConfig)."""
    return OmegaConf.create(to_dict(data_cfg))


def create_dataset(data_cfg: DataConfig, tokenizer: PreTrainedTokenizerBase, split: str) -> Dataset:
    """The dataset of ``split``: ``RLDataset`` or ``data.custom_cls``, called as
    ``cls(data_files=[...], tokenizer=tokenizer, config=data_cfg)`` plus, when
    ``data.<split>_max_samples`` is set (> 0), ``max_samples=N`` (verl's keyword: the custom
    class picks its rows itself, as in verl)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    files_key = f"{split}_files"
    files = as_file_list(getattr(data_cfg, files_key), f"data.{files_key}")
    max_samples = int(getattr(data_cfg, f"{split}_max_samples"))
    custom = data_cfg.custom_cls
    if custom.path or custom.name:
        dataset_cls = load_custom_dataset_class(custom.path, custom.name)
        extra = {"max_samples": max_samples} if max_samples > 0 else {}
        try:
            return dataset_cls(data_files=files, tokenizer=tokenizer, config=verl_data_config(data_cfg), **extra)
        except DataError:
            raise
        except Exception as exc:  # the user's class: say which one failed, not where inside it
            accepts = ", max_samples=N (data." + split + "_max_samples is set)" if extra else ""
            raise DataError(
                f"data.custom_cls.name={custom.name!r}: constructing it on {files} failed: {type(exc).__name__}: {exc}",
                key="data.custom_cls.name", fix=f"the class must accept (data_files=[...], tokenizer=..., config=data config{accepts})",
            ) from exc
    return RLDataset(data_files=files, tokenizer=tokenizer, config=data_cfg, files_key=f"data.{files_key}",
                     max_samples=max_samples)


def create_sampler(data_cfg: DataConfig, dataset: Dataset, shuffle: bool, seed: int) -> ResumableSampler:
    """``data.sampler.class_path/class_name`` (a ``torch.utils.data.Sampler`` subclass built as
    ``cls(data_source=dataset, data_config=data_cfg)``, verl's signature) wrapped for resuming,
    or the seeded random / sequential ``ResumableSampler``."""
    ref = data_cfg.sampler
    if not (ref.class_path or ref.class_name):
        return ResumableSampler(len(dataset), shuffle=shuffle, seed=seed)
    keys = ("data.sampler.class_path", "data.sampler.class_name")
    cls = load_class(ref.class_path, ref.class_name, keys, Sampler)
    if callable(getattr(cls, "update", None)):
        raise DataError(
            f"data.sampler.class_name={ref.class_name!r} has an update(batch) method: curriculum samplers "
            "that learn from training batches are not supported by megarl yet", key=keys[1],
            fix="use a sampler whose order does not depend on training feedback, or data.sampler.class_path=null",
        )
    try:
        sampler = cls(data_source=dataset, data_config=verl_data_config(data_cfg))
    except Exception as exc:
        raise DataError(f"data.sampler.class_name={ref.class_name!r}: constructing it failed: "
                        f"{type(exc).__name__}: {exc}", key=keys[1],
                        fix="the class must accept (data_source=dataset, data_config=data config)") from exc
    return ClassSampler(sampler, len(dataset), name=ref.class_name)


def create_dataloader(data_cfg: DataConfig, tokenizer: PreTrainedTokenizerBase, split: str) -> RLDataLoader:
    """A resumable loader over ``split``.

    train: ``data.train_batch_size`` prompts per batch, short last batch dropped,
    shuffled (``data.shuffle``) with seed ``data.seed``.
    val: ``data.val_batch_size`` prompts per batch (null = the whole set at once), nothing
    dropped; in file order, or with ``data.validation_shuffle`` in a random order drawn
    with ``data.seed`` (a new order each pass, like the training epochs).
    """
    dataset = create_dataset(data_cfg, tokenizer, split)
    seed = data_seed(data_cfg)
    if split == "train":
        batch_size = data_cfg.train_batch_size
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise DataError(f"data.train_batch_size must be a positive int, got {batch_size!r}",
                            key="data.train_batch_size", fix="set data.train_batch_size >= 1")
        if batch_size > len(dataset):
            fewer = f" (data.train_max_samples={data_cfg.train_max_samples})" if data_cfg.train_max_samples > 0 else ""
            raise DataError(
                f"data.train_batch_size={batch_size} exceeds the {len(dataset)} training prompts{fewer}; "
                "no full batch can be formed", key="data.train_batch_size",
                fix=f"set data.train_batch_size <= {len(dataset)}"
                    + (", raise data.train_max_samples" if fewer else "") + " or add training data",
            )
        sampler = create_sampler(data_cfg, dataset, bool(data_cfg.shuffle), seed)
        return RLDataLoader(dataset, batch_size, sampler, collate_fn, drop_last=True)
    batch_size = data_cfg.val_batch_size or len(dataset)
    if not isinstance(batch_size, int) or batch_size <= 0:
        raise DataError(f"data.val_batch_size must be a positive int or null, got {batch_size!r}",
                        key="data.val_batch_size", fix="set data.val_batch_size >= 1 or null")
    sampler = ResumableSampler(len(dataset), bool(data_cfg.validation_shuffle), seed)
    return RLDataLoader(dataset, batch_size, sampler, collate_fn, drop_last=False)
