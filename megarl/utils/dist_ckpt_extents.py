"""What can be checked of a Megatron dist checkpoint that has no checksums (written by an older megarl).

Its index (``.metadata``) lists where each item lies: file, offset and length. ``check_extents``
verifies that every file it names exists and holds every item it should (a truncated or missing
``*.distcp`` shard) and that each item starts as ``torch.save`` writes one, reading a few bytes
per item, not the tensors. Damage further inside a shard that keeps its size (zeroed bytes) is
found only by checksums, or when loading fails (megarl.trainer.resume_fallback falls back then too).
"""

from __future__ import annotations

import os

from megarl.utils.checksums import ChecksumError
from megarl.utils.safe_checkpoint import UnsafeCheckpointError, read_index

_ZIP_MAGIC = b"PK\x03\x04"
_ITEM_STARTS = (_ZIP_MAGIC, b"\x80")  # torch.save's zip format, or its legacy one (a pickle, protocol >= 2)


def check_extents(ckpt_dir: str) -> None:
    """Raise ChecksumError naming the first file of ``ckpt_dir`` that is missing, shorter than the items
    the index (``.metadata``, itself readable) places in it, or with an item that does not start as
    ``torch.save`` writes one (its first bytes zeroed or overwritten)."""
    index_file = os.path.join(ckpt_dir, ".metadata")
    if not os.path.isfile(index_file):
        raise ChecksumError(index_file, "missing (not a Megatron dist checkpoint without it)")
    try:
        metadata = read_index(index_file)
    except UnsafeCheckpointError as error:  # truncated or garbled; nothing of it was loaded
        raise ChecksumError(index_file, f"unreadable: {str(error).split(': ', 1)[-1].splitlines()[0]}") from None
    needed: dict[str, int] = {}  # file -> bytes its items need
    for info in metadata.storage_data.values():
        end = int(info.offset) + int(info.length)
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    for name, end in sorted(needed.items()):
        path = os.path.join(ckpt_dir, name)
        if not os.path.isfile(path):
            raise ChecksumError(path, "missing (the checkpoint index places items in it)")
        size = os.path.getsize(path)
        if size < end:
            raise ChecksumError(path, f"truncated: {size} bytes, its items need {end}")
    for index, info in metadata.storage_data.items():
        path = os.path.join(ckpt_dir, info.relative_path)
        with open(path, "rb") as handle:
            handle.seek(int(info.offset))
            head = handle.read(len(_ZIP_MAGIC))
        if not head.startswith(_ITEM_STARTS):
            raise ChecksumError(path, f"item {index.fqn!r} at byte {int(info.offset)} does not start as torch.save "
                                      f"writes (found {head!r})")
