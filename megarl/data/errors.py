"""The one error type for bad training data."""

from __future__ import annotations


class DataError(ValueError):
    """Bad input data; the message names the file, row index and column when known.

    ``key``: the config key the user changes to fix it (e.g. ``data.prompt_key``), when one
    does; ``fix``: what to do. Both are optional and are also appended to the message.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        row: int | None = None,
        column: str | None = None,
        key: str | None = None,
        fix: str | None = None,
    ):
        self.file, self.row, self.column, self.key, self.fix = file, row, column, key, fix
        self.problem = message
        where = [part for part in (
            file,
            None if row is None else f"row {row}",
            None if column is None else f"column {column!r}",
        ) if part is not None]
        self.where = ", ".join(where)
        text = f"{self.where}: {message}" if where else message
        super().__init__(f"{text}; fix: {fix}" if fix else text)
