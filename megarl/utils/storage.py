"""Write failures told in the user's words: "no space left on <mount>", not torch's.

torch.save reports a full disk as ``[enforce fail at inline_container.cc:672] . unexpected
pos 704 vs 598`` (its zip writer saw a short write; the errno is lost), torch.distributed
.checkpoint wraps the ``OSError`` of each rank. ``storage_error`` recognises both (and any
``OSError`` with ENOSPC / EDQUOT in the exception chain) and returns a ``StorageError``
naming the file, its mount point and the free space there; the original words are kept at
the end of the message.
"""

from __future__ import annotations

import errno
import os
import shutil

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# What torch's writers say when a write comes up short (the errno is not kept).
_SHORT_WRITE = ("unexpected pos", "PytorchStreamWriter failed writing file", "No space left on device",
                "Disk quota exceeded", "[Errno 28]", "[Errno 122]")
_LOW_FREE_BYTES = 64 << 20


class StorageError(OSError):
    """Writing a checkpoint, metrics or log file failed for lack of space (errno ENOSPC)."""

    def __reduce__(self):  # keep the message through pickling (Ray), not OSError's (errno, strerror) split
        return (StorageError, (self.errno, self.strerror))


def mount_point(path: str | os.PathLike) -> str:
    """The mount point holding ``path`` (its nearest existing ancestor)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path


def human_bytes(count: int) -> str:
    size = float(count)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{count} bytes"


def _chain(error: BaseException):
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def storage_error(error: BaseException, path: str | os.PathLike) -> StorageError | None:
    """A StorageError for ``error`` (raised while writing ``path``) when it is a full disk /
    quota / short write; None for anything else."""
    if any(isinstance(e, StorageError) for e in _chain(error)):
        return None  # already explained
    full = any(isinstance(e, OSError) and e.errno in _FULL_ERRNOS for e in _chain(error))
    words = " ".join(str(e) for e in _chain(error))
    if not full and not any(w in words for w in _SHORT_WRITE):
        return None
    mount = mount_point(path)
    try:
        free = shutil.disk_usage(mount).free
    except OSError:
        free = None
    # the innermost message naming the failure (torch's DCP wraps "[Errno 28] ..." in a CheckpointException)
    telling = [e for e in _chain(error) if (isinstance(e, OSError) and e.errno in _FULL_ERRNOS)
               or any(w in str(e) for w in _SHORT_WRITE)] or [error]
    original = next((line.strip() for line in str(telling[-1]).splitlines() if any(w in line for w in _SHORT_WRITE)),
                    str(telling[-1]).strip().splitlines()[0] if str(telling[-1]).strip() else type(error).__name__)
    shown = "unknown" if free is None else human_bytes(free)
    if full or free is None or free < _LOW_FREE_BYTES:
        text = f"no space left on {mount} ({shown} free) while writing {path} ({original})"
    else:
        text = (f"writing {path} failed: the device took only part of the data; no space left on {mount}, a quota or an "
                f"I/O error ({shown} free now; {original})")
    return StorageError(errno.ENOSPC, text)


def raise_if_storage_error(error: BaseException, path: str | os.PathLike) -> None:
    """Raise ``storage_error(error, path)`` from ``error`` when there is one."""
    explained = storage_error(error, path)
    if explained is not None:
        raise explained from error
