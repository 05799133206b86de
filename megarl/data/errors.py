"""The one error type for bad training data."""

from __future__ import annotations


class DataError(ValueError):
    """Bad input data; the message names the file, row index and column when known."""

    def __init__(self, message: str, *, file: str | None = None, row: int | None = None, column: str | None = None):
        self.file, self.row, self.column = file, row, column
        where = [part for part in (
            file,
            None if row is None else f"row {row}",
            None if column is None else f"column {column!r}",
        ) if part is not None]
        super().__init__(f"{', '.join(where)}: {message}" if where else message)
