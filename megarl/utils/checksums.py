"""Checksum manifests: what a checkpoint directory held when it was written.

``checksums.json`` in a directory lists every file under it (relative path -> size in bytes
and sha256), itself excluded. It is written after the files, by whoever wrote them (the
workers for ``actor/`` and ``critic/``, hashing their share of the files in parallel; the
controller for the step directory). ``verify_manifest`` re-reads every listed file and
raises ``ChecksumError`` naming the first one that is missing, has another size
(truncated) or other bytes (silent damage, e.g. a zeroed page).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MANIFEST = "checksums.json"
_CHUNK = 8 << 20  # bytes per read: hashlib releases the GIL on large buffers, so threads overlap
THREADS = min(16, os.cpu_count() or 1)


class ChecksumError(RuntimeError):
    """A file differs from its manifest entry (or the manifest itself is missing / unreadable).

    ``file``: the path; ``problem``: what differs.
    """

    def __init__(self, file: str | os.PathLike, problem: str) -> None:
        self.file, self.problem = str(file), problem
        super().__init__(f"{file}: {problem}")


def digest(path: str | os.PathLike) -> dict[str, int | str]:
    """``{"size": bytes, "sha256": hex}`` of one file."""
    sha = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return {"size": size, "sha256": sha.hexdigest()}


def list_files(directory: str | os.PathLike) -> list[str]:
    """Relative paths of every file under ``directory`` (sorted), manifests excluded."""
    root = Path(directory)
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.name != MANIFEST)


def digest_files(directory: str | os.PathLike, names: Iterable[str], threads: int = THREADS) -> dict[str, dict]:
    """``{name: digest}`` for ``names`` (relative to ``directory``), hashed on ``threads`` threads."""
    names = list(names)
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(names)))) as pool:
        return dict(zip(names, pool.map(lambda n: digest(Path(directory) / n), names)))


def write_manifest(directory: str | os.PathLike, entries: dict[str, dict] | None = None) -> Path:
    """Write ``<directory>/checksums.json`` from ``entries`` (``{name: digest}``); None = hash
    every file under ``directory`` here."""
    if entries is None:
        entries = digest_files(directory, list_files(directory))
    path = Path(directory) / MANIFEST
    tmp = path.with_name(f".{MANIFEST}.tmp")
    tmp.write_text(json.dumps({"format": 1, "algorithm": "sha256", "files": dict(sorted(entries.items()))}, indent=1))
    os.replace(tmp, path)
    return path


def has_manifest(directory: str | os.PathLike) -> bool:
    return (Path(directory) / MANIFEST).is_file()


def read_manifest(directory: str | os.PathLike) -> dict[str, dict]:
    """The ``files`` of ``<directory>/checksums.json``; ChecksumError when missing or unreadable."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise ChecksumError(path, "missing (the checkpoint was not completely written)")
    try:
        files = json.loads(path.read_text())["files"]
        if not isinstance(files, dict):
            raise TypeError("'files' is not a mapping")
        return files
    except (ValueError, KeyError, TypeError) as error:
        raise ChecksumError(path, f"unreadable ({type(error).__name__}: {error})") from None


def verify_manifest(directory: str | os.PathLike, threads: int = THREADS, select: Callable[[str], bool] | None = None) -> None:
    """Check every file listed in ``<directory>/checksums.json``: present, same size, same sha256.

    Sizes are checked first (cheap; catches truncation), then the bytes. ``select``: check only
    the listed names it accepts. Raises ChecksumError naming the first bad file in listing order.
    """
    root = Path(directory)
    files = {n: e for n, e in read_manifest(root).items() if select is None or select(n)}
    for name, entry in files.items():
        path = root / name
        if not path.is_file():
            raise ChecksumError(path, "missing")
        size = path.stat().st_size
        if size != entry["size"]:
            raise ChecksumError(path, f"{size} bytes, {entry['size']} when written (truncated or overwritten)")
    found = digest_files(root, files, threads)
    for name, entry in files.items():
        if found[name]["sha256"] != entry["sha256"]:
            raise ChecksumError(root / name, "sha256 differs from when it was written (the bytes are damaged)")
