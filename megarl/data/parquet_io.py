"""Read parquet files into Python rows (pyarrow only, no pandas)."""

from __future__ import annotations

import os
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from megarl.data.errors import DataError


def as_file_list(files: str | os.PathLike | Sequence[str | os.PathLike] | None, key: str) -> list[str]:
    """Normalise a ``data.*_files`` value (one path or a list) to expanded path strings."""
    if files is None:
        raise DataError(f"{key} is not set; give a parquet file or a list of them")
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    paths = [os.path.expanduser(os.fspath(f)) for f in files]
    if not paths:
        raise DataError(f"{key} is an empty list; give at least one parquet file")
    return paths


def read_parquet_table(path: str, required_columns: Sequence[str] = ()) -> pa.Table:
    """The whole table of one file; DataError names the file (and column) on any problem."""
    if not os.path.isfile(path):
        raise DataError("file not found", file=path)
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"cannot read parquet ({type(exc).__name__}: {exc})", file=path) from None
    if table.num_rows == 0:
        raise DataError("file has no rows", file=path)
    for column in required_columns:
        if column not in table.column_names:
            raise DataError(f"column missing; the file has {table.column_names}", file=path, column=column)
    return table


def read_parquet_rows(path: str, required_columns: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Rows of one file as dicts (structs become dicts, lists stay lists)."""
    return read_parquet_table(path, required_columns).to_pylist()
