"""Read parquet files into Python rows (pyarrow only, no pandas)."""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from megarl.data.errors import DataError


def as_file_list(files: str | os.PathLike | Sequence[str | os.PathLike] | None, key: str) -> list[str]:
    """Normalise a ``data.*_files`` value (one path or a list) to expanded path strings."""
    if files is None:
        raise DataError(f"{key} is not set", key=key, fix=f"give {key} a parquet file or a list of them")
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    paths = [os.path.expanduser(os.fspath(f)) for f in files]
    if not paths:
        raise DataError(f"{key} is an empty list", key=key, fix=f"give {key} at least one parquet file")
    return paths


def read_parquet_table(
    path: str,
    required_columns: Sequence[str] = (),
    *,
    files_key: str = "data.train_files",
    column_keys: Mapping[str, str] | None = None,
) -> pa.Table:
    """The whole table of one file; DataError names the file (and column) on any problem.

    files_key: the config key that lists this file; column_keys: column -> the config key
    that names it (e.g. ``{"prompt": "data.prompt_key"}``); both go into the error's fix.
    """
    if not os.path.isfile(path):
        raise DataError("file not found", file=path, key=files_key, fix=f"point {files_key} at an existing parquet file")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        why = str(exc).replace(f" '{path}'", "").split(". ")[0]  # arrow repeats the path and adds advice
        raise DataError(
            f"cannot read parquet ({type(exc).__name__}: {why})", file=path, key=files_key,
            fix=f"re-create the file (e.g. pandas DataFrame.to_parquet) or remove it from {files_key}",
        ) from None
    if table.num_rows == 0:
        raise DataError("file has no rows", file=path, key=files_key, fix=f"add rows to it or remove it from {files_key}")
    for column in required_columns:
        if column not in table.column_names:
            key = (column_keys or {}).get(column)
            fix = f"set {key} to the column that holds it" if key else "add the column"
            raise DataError(
                f"column missing; the file has {table.column_names}", file=path, column=column, key=key, fix=fix,
            )
    return table


def read_parquet_rows(
    path: str,
    required_columns: Sequence[str] = (),
    *,
    files_key: str = "data.train_files",
    column_keys: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Rows of one file as dicts (structs become dicts, lists stay lists)."""
    return read_parquet_table(path, required_columns, files_key=files_key, column_keys=column_keys).to_pylist()
