"""megatron-core's checkpoint writer keeps a failed write's reason in its exception once megarl's
shim is applied (megatron-core 0.19.2 puts only the result's type there; the full disk itself is
tests/fault/test_reliability_e2e.py::test_disk_full_during_save_is_named_and_leaves_no_partial_step)."""

from __future__ import annotations

import queue

from megatron.core.dist_checkpointing.strategies.filesystem_async import FileSystemWriterAsync

from megarl.compat.megatron_core import checkpoint_write


def _write_error(tmp_path) -> str:
    """The message the writer reports for one shard that cannot be opened (its directory is missing)."""
    shard = str(tmp_path / "missing_dir" / "__0_0.distcp")
    results: queue.Queue = queue.Queue()
    FileSystemWriterAsync.write_preloaded_data_multithread([], False, 0, [(shard, "key", ([], []))], results)
    error = results.get_nowait()
    assert isinstance(error, Exception), error
    return str(error)


def test_the_writers_exception_names_why_the_write_failed(tmp_path, monkeypatch):
    write = FileSystemWriterAsync.write_preloaded_data
    unpatched = write.__wrapped__ if checkpoint_write._APPLIED else write  # a save in this process applied it
    monkeypatch.setattr(FileSystemWriterAsync, "write_preloaded_data", staticmethod(unpatched))
    monkeypatch.setattr(checkpoint_write, "_APPLIED", False)
    assert "No such file or directory" not in _write_error(tmp_path)  # megatron-core 0.19.2 without the shim
    checkpoint_write.keep_write_errors()
    assert "No such file or directory" in _write_error(tmp_path)
