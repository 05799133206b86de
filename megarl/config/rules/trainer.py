"""Trainer rules: step frequencies, resume, data files."""

from __future__ import annotations

import os
from collections.abc import Iterator

from megarl.config.errors import Issue
from megarl.config.names import OPTIONAL_LOGGERS
from megarl.config.rules.view import View, has_module, needs_files


def frequencies(v: View) -> Iterator[Issue]:
    for name in ("save_freq", "test_freq"):
        key = f"trainer.{name}"
        value = v.get(key)
        if value == 0 or value < -1:
            yield Issue(key, value, "must be a positive number of steps or -1 (off)", f"set {key}=-1 to turn it off, or a step count >= 1")


def resume(v: View) -> Iterator[Issue]:
    mode, path = v.get("trainer.resume_mode"), v.path("trainer.resume_from_path")
    if mode == "resume_path" and path is None:
        yield Issue("trainer.resume_from_path", None, "trainer.resume_mode=resume_path needs a checkpoint dir", "set trainer.resume_from_path=<default_local_dir>/global_step_N")
    elif path is not None and mode != "resume_path":
        yield Issue("trainer.resume_from_path", v.get("trainer.resume_from_path"), f"is ignored unless trainer.resume_mode=resume_path (it is {mode!r})", "set trainer.resume_mode=resume_path, or trainer.resume_from_path=null")
    elif path is not None and not os.path.isdir(path):
        yield Issue("trainer.resume_from_path", v.get("trainer.resume_from_path"), "checkpoint directory does not exist", "point it at an existing global_step_N dir")


@needs_files("data files (data.train_files / val_files)")
def data_files(v: View) -> Iterator[Issue]:
    for key in ("data.train_files", "data.val_files"):
        files = v.get(key)
        files = [files] if isinstance(files, str) else files
        if not files:
            yield Issue(key, files, "no files given", f"set {key} to a parquet file or a list of them")
        for f in files:
            if "://" in f:
                yield Issue(key, f, "remote paths (hdfs://, s3://) are not supported by megarl", "copy the file to local disk and give its path")
            elif not os.path.isfile(os.path.expanduser(f)):
                yield Issue(key, f, "file does not exist", f"give an existing parquet file in {key}")


def logger_packages(v: View) -> Iterator[Issue]:
    """A logger whose package is missing fails here, before Ray starts, not at the first step."""
    loggers = v.get("trainer.logger")
    for name in [loggers] if isinstance(loggers, str) else loggers:
        if name in OPTIONAL_LOGGERS and not has_module(name):
            yield Issue("trainer.logger", loggers, f"logger '{name}' needs the '{name}' package, which is not installed",
                        f"pip install {name} (or megarl[{name}]), or remove '{name}' from trainer.logger")


RULES = (frequencies, resume, data_files, logger_packages)
