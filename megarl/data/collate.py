"""Collate dataset items into a DataProto."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from megarl.protocol import DataProto, to_object_array


def collate_fn(items: Sequence[dict[str, Any]]) -> DataProto:
    """Stack tensor fields (each ``[P]`` -> ``[B, P]``); gather the rest into object arrays.

    Every item must have the same keys (error names the first item that differs).
    """
    if not items:
        raise ValueError("collate_fn: empty batch")
    keys = list(items[0].keys())
    for i, item in enumerate(items[1:], start=1):
        if set(item.keys()) != set(keys):
            raise ValueError(f"collate_fn: item {i} has keys {sorted(item)}, item 0 has {sorted(keys)}")
    tensors = {k: torch.stack([item[k] for item in items]) for k in keys if isinstance(items[0][k], torch.Tensor)}
    non_tensors = {k: to_object_array([item[k] for item in items]) for k in keys if k not in tensors}
    return DataProto.from_dict(tensors, non_tensors)
