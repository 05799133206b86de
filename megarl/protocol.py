"""DataProto: the batch that flows between the controller and the workers.

A DataProto holds B rows in three parts:

* ``batch`` — a ``TensorDict`` with ``batch_size == [B]``; every tensor is ``[B, ...]``.
* ``non_tensor_batch`` — ``dict[str, np.ndarray]``, each a 1-D object array of length B
  (strings, dicts, chat message lists, ...).
* ``meta_info`` — a plain dict shared by all rows (temperature, global_step, metrics, ...).

Operations that pick rows (slicing, ``chunk``, ``split``, ``repeat``, ``reorder``,
``pad_to_divisor``) act on ``batch`` and ``non_tensor_batch`` together and keep
``meta_info``. Pickling copies sliced tensors into their own storage, so sending one
chunk of a big batch to a Ray worker costs the chunk's bytes, not the whole batch's.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch
from tensordict import TensorDict

__all__ = ["DataProto", "DataProtoItem", "to_object_array"]

# meta_info keys whose values legitimately differ between parts; concat collects them in a list.
_GATHERED_META_KEYS = ("metrics",)


def to_object_array(values: Sequence[Any] | np.ndarray) -> np.ndarray:
    """Return a 1-D object array with one element per entry of ``values``.

    ``np.array(list_of_lists, dtype=object)`` would build a 2-D array when the inner
    lists have equal lengths; this keeps each entry (a chat, a dict, a string) whole.
    """
    if isinstance(values, np.ndarray) and values.dtype == object and values.ndim == 1:
        return values
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


def _values_equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and bool(torch.equal(a, b))
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.shape == b.shape
            and all(_values_equal(x, y) for x, y in zip(a.tolist(), b.tolist()))
        )
    try:
        return bool(a == b)
    except Exception:  # values whose == is ambiguous count as different
        return False


def _compact(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself if it owns exactly its bytes; otherwise a compact copy."""
    if t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.clone(memory_format=torch.contiguous_format)


@dataclass
class DataProtoItem:
    """One row of a DataProto: tensors without the batch dim, non-tensors as their values."""

    batch: TensorDict
    non_tensor_batch: dict[str, Any] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)


@dataclass
class DataProto:
    """B rows of tensors and non-tensors plus batch-wide meta info (see module docstring)."""

    batch: TensorDict
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.check_consistency()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(
        cls,
        tensors: Mapping[str, torch.Tensor] | None = None,
        non_tensors: Mapping[str, Sequence[Any] | np.ndarray] | None = None,
        meta_info: Mapping[str, Any] | None = None,
    ) -> "DataProto":
        """Build from ``{key: [B, ...] tensor}`` and ``{key: length-B sequence}``.

        B is taken from the first tensor (or the first non-tensor when there are no
        tensors); every other entry must have the same length (error names the key).
        """
        tensors = dict(tensors or {})
        non_tensors = {k: to_object_array(v) for k, v in (non_tensors or {}).items()}
        if tensors:
            first_key, first = next(iter(tensors.items()))
            if first.dim() == 0:
                raise ValueError(f"DataProto tensor {first_key!r} is a scalar; tensors need a batch dim")
            batch_size = first.shape[0]
        elif non_tensors:
            batch_size = len(next(iter(non_tensors.values())))
        else:
            batch_size = 0
        for key, tensor in tensors.items():
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"DataProto tensor {key!r} is a {type(tensor).__name__}, not a torch.Tensor")
            if tensor.dim() == 0 or tensor.shape[0] != batch_size:
                raise ValueError(
                    f"DataProto tensor {key!r} has shape {tuple(tensor.shape)}; expected batch size "
                    f"{batch_size} in dim 0 (from {next(iter(tensors))!r})"
                )
        batch = TensorDict(tensors, batch_size=[batch_size])
        return cls(batch=batch, non_tensor_batch=non_tensors, meta_info=dict(meta_info or {}))

    def check_consistency(self) -> None:
        """Raise ValueError unless every non-tensor is a 1-D array of length B."""
        if not isinstance(self.batch, TensorDict) or len(self.batch.batch_size) != 1:
            raise ValueError("DataProto.batch must be a TensorDict with batch_size [B]")
        batch_size = self.batch.batch_size[0]
        for key, value in self.non_tensor_batch.items():
            if not isinstance(value, np.ndarray) or value.ndim != 1:
                raise ValueError(
                    f"DataProto non-tensor {key!r} must be a 1-D np.ndarray (dtype=object); "
                    f"got {type(value).__name__}{getattr(value, 'shape', '')}"
                )
            if len(value) != batch_size:
                raise ValueError(
                    f"DataProto non-tensor {key!r} has length {len(value)}, batch size is {batch_size}"
                )

    # ------------------------------------------------------------------ row access
    def __len__(self) -> int:
        return int(self.batch.batch_size[0])

    def __getitem__(self, index: int | slice | torch.Tensor | np.ndarray | Sequence[int]):
        """``data[i]`` -> DataProtoItem (row i); slices and index arrays -> DataProto."""
        if isinstance(index, (int, np.integer)):
            i = int(index)
            if not -len(self) <= i < len(self):
                raise IndexError(f"row {i} out of range for DataProto of length {len(self)}")
            return DataProtoItem(
                batch=self.batch[i],
                non_tensor_batch={k: v[i] for k, v in self.non_tensor_batch.items()},
                meta_info=self.meta_info,
            )
        if isinstance(index, slice):
            np_index: slice | np.ndarray = index
            td_index: slice | torch.Tensor = index
        else:
            td_index = torch.as_tensor(index)
            if td_index.dtype == torch.bool:
                td_index = td_index.nonzero().flatten()
            if td_index.dim() != 1 or td_index.is_floating_point():
                raise TypeError("DataProto index must be an int, a slice, or a 1-D integer/bool index")
            td_index = td_index.long()
            np_index = td_index.cpu().numpy()
        return DataProto(
            batch=self.batch[td_index],
            non_tensor_batch={k: v[np_index] for k, v in self.non_tensor_batch.items()},
            meta_info=self.meta_info,
        )

    def __iter__(self) -> Iterator[DataProtoItem]:
        for i in range(len(self)):
            yield self[i]

    def slice(self, start: int, end: int) -> "DataProto":
        return self[start:end]

    # ------------------------------------------------------------------ key selection
    def select(
        self,
        batch_keys: Sequence[str] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
    ) -> "DataProto":
        """Keep only the named keys (None keeps all of that part). Missing key -> KeyError."""

        def pick(part: str, available: Mapping[str, Any], keys: Sequence[str] | None) -> list[str]:
            if keys is None:
                return list(available.keys())
            missing = [k for k in keys if k not in available]
            if missing:
                raise KeyError(f"DataProto.select: {part} has no key(s) {missing}; available: {sorted(available)}")
            return list(keys)

        tensor_keys = pick("batch", dict(self.batch.items()), batch_keys)
        non_tensor_keys = pick("non_tensor_batch", self.non_tensor_batch, non_tensor_batch_keys)
        meta_keys = pick("meta_info", self.meta_info, meta_info_keys)
        return DataProto(
            batch=self.batch.select(*tensor_keys),
            non_tensor_batch={k: self.non_tensor_batch[k] for k in non_tensor_keys},
            meta_info={k: self.meta_info[k] for k in meta_keys},
        )

    def pop(
        self,
        batch_keys: Sequence[str] = (),
        non_tensor_batch_keys: Sequence[str] = (),
        meta_info_keys: Sequence[str] = (),
    ) -> "DataProto":
        """Remove the named keys from self and return them as a new DataProto."""
        out = self.select(list(batch_keys), list(non_tensor_batch_keys), list(meta_info_keys))
        for k in batch_keys:
            del self.batch[k]
        for k in non_tensor_batch_keys:
            del self.non_tensor_batch[k]
        for k in meta_info_keys:
            del self.meta_info[k]
        return out

    def union(self, other: "DataProto") -> "DataProto":
        """Merge ``other``'s keys into self (in place; returns self).

        Both must have the same length. A key present in both must hold equal values,
        otherwise ValueError names it.
        """
        if len(self) != len(other):
            raise ValueError(f"DataProto.union: lengths differ ({len(self)} vs {len(other)})")
        for key, tensor in other.batch.items():
            if key in self.batch.keys() and not _values_equal(self.batch[key], tensor):
                raise ValueError(f"DataProto.union: tensor {key!r} differs between the two batches")
        for key, value in other.non_tensor_batch.items():
            if key in self.non_tensor_batch and not _values_equal(self.non_tensor_batch[key], value):
                raise ValueError(f"DataProto.union: non-tensor {key!r} differs between the two batches")
        for key, value in other.meta_info.items():
            if key in self.meta_info and not _values_equal(self.meta_info[key], value):
                raise ValueError(f"DataProto.union: meta_info {key!r} differs between the two batches")
        for key, tensor in other.batch.items():
            self.batch[key] = tensor
        self.non_tensor_batch.update(other.non_tensor_batch)
        self.meta_info.update(other.meta_info)
        return self

    # ------------------------------------------------------------------ splitting / joining
    def chunk(self, chunks: int) -> list["DataProto"]:
        """Split into ``chunks`` equal parts; B must be divisible by ``chunks``."""
        if chunks <= 0:
            raise ValueError(f"DataProto.chunk: chunks must be positive, got {chunks}")
        if len(self) % chunks != 0:
            raise ValueError(
                f"DataProto.chunk: batch size {len(self)} is not divisible by {chunks}; "
                "use pad_to_divisor first"
            )
        return self.split(len(self) // chunks)

    def split(self, split_size: int) -> list["DataProto"]:
        """Consecutive parts of ``split_size`` rows (the last one may be shorter)."""
        if split_size <= 0:
            raise ValueError(f"DataProto.split: split_size must be positive, got {split_size}")
        return [self[start : start + split_size] for start in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: Sequence["DataProto"]) -> "DataProto":
        """Join along the batch dim. All parts need the same keys.

        meta_info: keys must agree across parts (error names the key), except
        ``metrics``, whose per-part values are gathered into a list.
        """
        if not data:
            raise ValueError("DataProto.concat: empty list")
        tensor_keys = set(data[0].batch.keys())
        non_tensor_keys = set(data[0].non_tensor_batch)
        for i, part in enumerate(data[1:], start=1):
            if set(part.batch.keys()) != tensor_keys or set(part.non_tensor_batch) != non_tensor_keys:
                raise ValueError(
                    f"DataProto.concat: part {i} has keys {sorted(part.batch.keys())} / "
                    f"{sorted(part.non_tensor_batch)}, part 0 has {sorted(tensor_keys)} / {sorted(non_tensor_keys)}"
                )
        batch = torch.cat([part.batch for part in data], dim=0)
        non_tensor_batch = {
            k: to_object_array(np.concatenate([part.non_tensor_batch[k] for part in data])) for k in non_tensor_keys
        }
        meta_info: dict[str, Any] = {}
        for part in data:
            for key, value in part.meta_info.items():
                if key in _GATHERED_META_KEYS:
                    meta_info.setdefault(key, []).extend(value if isinstance(value, list) else [value])
                elif key not in meta_info:
                    meta_info[key] = value
                elif not _values_equal(meta_info[key], value):
                    raise ValueError(f"DataProto.concat: meta_info {key!r} differs between parts")
        return DataProto(batch=batch, non_tensor_batch=non_tensor_batch, meta_info=meta_info)

    # ------------------------------------------------------------------ row order / count
    def repeat(self, repeat_times: int, interleave: bool = True) -> "DataProto":
        """Each row ``repeat_times`` times: ``aabb`` if interleave else ``abab``."""
        if repeat_times <= 0:
            raise ValueError(f"DataProto.repeat: repeat_times must be positive, got {repeat_times}")
        rows = torch.arange(len(self))
        index = rows.repeat_interleave(repeat_times) if interleave else rows.repeat(repeat_times)
        return self[index]

    def reorder(self, indices: torch.Tensor | np.ndarray | Sequence[int]) -> "DataProto":
        """Permute rows in place (verl semantics): row i becomes old row ``indices[i]``. Returns self."""
        reordered = self[indices]
        self.batch = reordered.batch
        self.non_tensor_batch = reordered.non_tensor_batch
        return self

    def pad_to_divisor(self, size_divisor: int) -> tuple["DataProto", int]:
        """Append copies of the leading rows until B is a multiple of ``size_divisor``.

        Returns ``(padded, pad_size)``; ``padded.unpad(pad_size)`` gives the rows back.
        """
        if size_divisor <= 0:
            raise ValueError(f"DataProto.pad_to_divisor: size_divisor must be positive, got {size_divisor}")
        pad_size = (-len(self)) % size_divisor
        if pad_size == 0:
            return self, 0
        if len(self) == 0:
            raise ValueError("DataProto.pad_to_divisor: cannot pad an empty batch")
        index = torch.cat([torch.arange(len(self)), torch.arange(pad_size) % len(self)])
        return self[index], pad_size

    def unpad(self, pad_size: int) -> "DataProto":
        """Drop the last ``pad_size`` rows (undo :meth:`pad_to_divisor`)."""
        if pad_size < 0 or pad_size > len(self):
            raise ValueError(f"DataProto.unpad: pad_size {pad_size} out of range for length {len(self)}")
        return self[: len(self) - pad_size]

    # ------------------------------------------------------------------ misc
    def to(self, device: str | torch.device) -> "DataProto":
        """Move tensors to ``device`` (in place; returns self)."""
        self.batch = self.batch.to(device)
        return self

    def copy(self) -> "DataProto":
        """Deep copy (tensors cloned)."""
        return DataProto(
            batch=self.batch.clone(),
            non_tensor_batch=copy.deepcopy(self.non_tensor_batch),
            meta_info=copy.deepcopy(self.meta_info),
        )

    def __getstate__(self) -> dict[str, Any]:
        # Plain dict of compact tensors: a view into a larger batch would otherwise pickle
        # its whole storage.
        return {
            "tensors": {k: _compact(v) for k, v in self.batch.items()},
            "batch_size": int(self.batch.batch_size[0]),
            "device": None if self.batch.device is None else str(self.batch.device),
            "non_tensor_batch": self.non_tensor_batch,
            "meta_info": self.meta_info,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.batch = TensorDict(state["tensors"], batch_size=[state["batch_size"]], device=state["device"])
        self.non_tensor_batch = state["non_tensor_batch"]
        self.meta_info = state["meta_info"]

    def __repr__(self) -> str:
        tensors = ", ".join(f"{k}: {tuple(v.shape)} {v.dtype}" for k, v in self.batch.items())
        return (
            f"DataProto(len={len(self)}, batch={{{tensors}}}, "
            f"non_tensor_batch={sorted(self.non_tensor_batch)}, meta_info={sorted(self.meta_info)})"
        )
