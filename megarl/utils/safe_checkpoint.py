"""Refuse a checkpoint that would run code when loaded, before anything loads it.

A Megatron dist checkpoint (torch_dist format = torch.distributed.checkpoint) unpickles
two things with no restriction when loaded: the ``.metadata`` index (``pickle.load``) and
every non-tensor item (``torch.load(weights_only=False)``: RNG states, extra states).
``verify_dist_checkpoint`` reads both the safe way first: ``.metadata`` with an unpickler
that only builds the checkpoint-index classes, each non-tensor item and ``common.pt`` with
``torch.load(weights_only=True)`` (numpy arrays allowed, for RNG states). A file holding
anything else raises ``UnsafeCheckpointError`` naming it; nothing of it has run.
"""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from typing import Any

import numpy as np
import torch

from megarl.utils.checksums import ChecksumError

__all__ = ["UnsafeCheckpointError", "read_index", "verify_dist_checkpoint", "safe_torch_load"]


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint file holds something other than tensors and plain values (refused, not run)."""


_DCP = "torch.distributed.checkpoint"
_METADATA_CLASSES = {
    ("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),  # StorageMeta.checkpoint_id
    (f"{_DCP}.filesystem", "_StorageInfo"),
    *((f"{_DCP}.metadata", n) for n in ("Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
                                         "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
                                         "_MEM_FORMAT_ENCODING")),
    *((f"{_DCP}.planner", n) for n in ("SavePlan", "WriteItem", "WriteItemType", "TensorWriteData")),
}


# torch's weights-only unpickler names what it refused; any other unpickling error is damage (garbled bytes)
_REFUSED = ("Unsupported global", "GLOBAL", "unrecognized function", "Unsupported class")


def _numpy_globals() -> list[Any]:
    """What a numpy array (an RNG state) needs under weights_only."""
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct
    return [_reconstruct, np.ndarray, np.dtype, *(getattr(np.dtypes, n) for n in ("UInt32DType", "Int64DType",
                                                                                   "Float64DType") if hasattr(np, "dtypes"))]


class _IndexUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_CLASSES or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint index")


def _refuse(file: str, what: str, error: BaseException) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(
        f"{file}: refused to load {what}: it holds Python objects other than tensors and plain values, which could "
        f"run code when unpickled ({str(error).splitlines()[0] if str(error) else type(error).__name__}). Load only "
        "checkpoints megarl wrote (trainer.default_local_dir, trainer.resume_from_path, "
        "megatron.dist_checkpointing_path)."
    )


def safe_torch_load(source: str | io.BytesIO, what: str, file: str) -> Any:
    """``torch.load(weights_only=True)`` (numpy arrays allowed); UnsafeCheckpointError for anything else,
    ChecksumError naming ``file`` when it cannot be read at all (truncated, garbled)."""
    try:
        with torch.serialization.safe_globals(_numpy_globals()):
            return torch.load(source, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        if any(word in str(error) for word in _REFUSED):
            raise _refuse(file, what, error) from None
        raise _damaged(file, what, error) from None
    except (RuntimeError, EOFError, ValueError, zipfile.BadZipFile) as error:  # torch's zip reader / unpickler on damage
        raise _damaged(file, what, error) from None


def _damaged(file: str, what: str, error: BaseException) -> ChecksumError:
    first = str(error).splitlines()[0] if str(error) else ""
    return ChecksumError(file, f"unreadable ({what}): {type(error).__name__}{': ' + first if first else ''}")


def read_index(index_file: str) -> Any:
    """The ``.metadata`` index of a torch_dist checkpoint, unpickled with only its own classes allowed."""
    try:
        with open(index_file, "rb") as handle:
            metadata = _IndexUnpickler(handle).load()
    except (pickle.UnpicklingError, AttributeError, TypeError, EOFError) as error:
        raise _refuse(index_file, "the checkpoint index", error) from None
    from torch.distributed.checkpoint.metadata import Metadata

    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(f"{index_file}: not a checkpoint index (found {type(metadata).__name__})")
    return metadata


def verify_dist_checkpoint(ckpt_dir: str) -> None:
    """Check a torch_dist checkpoint directory (``.metadata``, ``*.distcp``, ``common.pt``).

    Raises:
        FileNotFoundError: no ``.metadata`` (not a torch_dist checkpoint).
        UnsafeCheckpointError: a file or item that would run code when loaded.
    """
    index_file = os.path.join(ckpt_dir, ".metadata")
    if not os.path.isfile(index_file):
        raise FileNotFoundError(f"{ckpt_dir}: not a Megatron dist checkpoint (no .metadata)")
    metadata = read_index(index_file)
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

    for fqn, item in metadata.state_dict_metadata.items():
        if not isinstance(item, BytesStorageMetadata):
            continue
        info = metadata.storage_data.get(MetadataIndex(fqn))
        if info is None:
            continue
        file = os.path.join(ckpt_dir, info.relative_path)
        if os.path.dirname(os.path.abspath(file)) != os.path.abspath(ckpt_dir):
            raise UnsafeCheckpointError(f"{index_file}: item {fqn!r} points outside the checkpoint ({info.relative_path!r})")
        if getattr(info, "transform_descriptors", None):
            raise UnsafeCheckpointError(f"{file}: item {fqn!r} is stored with transforms megarl cannot check")
        with open(file, "rb") as handle:
            handle.seek(info.offset)
            raw = handle.read(info.length)
        safe_torch_load(io.BytesIO(raw), f"item {fqn!r}", file)
    common = os.path.join(ckpt_dir, "common.pt")
    if os.path.isfile(common):
        safe_torch_load(common, "the common state", common)
