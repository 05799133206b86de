"""verl's other ``trainer.logger`` sinks: ``file`` (verl's jsonl layout), ``mlflow``, ``swanlab``.

They read verl's environment variables, so a verl launch script logs to the same place:
``VERL_FILE_LOGGER_PATH`` / ``VERL_FILE_LOGGER_ROOT`` (file), ``MLFLOW_TRACKING_URI`` /
``MLFLOW_RUN_ID`` (mlflow), ``SWANLAB_API_KEY`` / ``SWANLAB_LOG_DIR`` / ``SWANLAB_MODE`` (swanlab).
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import re
from types import ModuleType
from typing import Any, Mapping

log = logging.getLogger(__name__)

# verl's default store when MLFLOW_TRACKING_URI is unset (needs the full `mlflow` package: sqlite).
MLFLOW_DEFAULT_URI = "sqlite:////tmp/mlruns.db"


def import_logger_package(name: str) -> ModuleType:
    """The optional package behind logger ``name`` (same import and pip name), or an error naming both."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        raise ImportError(f"trainer.logger includes '{name}', but the '{name}' package is not installed: "
                          f"pip install {name} (or megarl[{name}]), or remove '{name}' from trainer.logger") from error


def _number(value: Any) -> float | None:
    """A metric as a float; None for what is not a number (text, arrays)."""
    if hasattr(value, "item"):
        try:
            value = value.item()
        except (ValueError, RuntimeError):  # a multi-element array
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1, "c": [2, 3]}}`` -> ``{"a/b": 1, "a/c/list_len": 2, "a/c/0": 2, "a/c/1": 3}`` (verl's
    mlflow params: lists become ``list_len`` plus one key per item)."""
    if isinstance(tree, Mapping):
        items = tree.items()
    elif isinstance(tree, (list, tuple)):
        items = [("list_len", len(tree)), *((str(i), v) for i, v in enumerate(tree))]
    else:
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in items:
        out.update(flatten(value, f"{prefix}/{key}" if prefix else str(key)))
    return out


class FileLogger:
    """verl's ``file`` logger: one ``{"step": N, "data": {metric: value}}`` line per step in
    ``$VERL_FILE_LOGGER_PATH``, else ``$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl`` (root
    defaults to the working directory). Appends (verl truncates): a relaunch keeps earlier steps."""

    def __init__(self, project: str, experiment: str) -> None:
        path = os.environ.get("VERL_FILE_LOGGER_PATH")
        if path is None:
            root = os.path.expanduser(os.environ.get("VERL_FILE_LOGGER_ROOT", "."))
            path = os.path.join(root, project, f"{experiment}.jsonl")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.path = path
        self.handle = open(path, "a")

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        data = {}
        for key, value in metrics.items():
            number = _number(value)
            # JSON has no NaN/inf: they are written as null (verl's orjson does the same).
            data[key] = (None if not math.isfinite(number) else number) if number is not None else str(value)
        self.handle.write(json.dumps({"step": int(step), "data": data}) + "\n")
        self.handle.flush()

    def close(self) -> None:
        self.handle.close()


class MlflowLogger:
    """An MLflow run: experiment = ``trainer.project_name``, run name = ``trainer.experiment_name``,
    the config as flattened params, numeric metrics per step. Store: ``$MLFLOW_TRACKING_URI`` (verl's
    default ``sqlite:////tmp/mlruns.db``); ``$MLFLOW_RUN_ID`` attaches to an existing run."""

    _INVALID = re.compile(r"[^/\w.\- :]")  # mlflow's allowed key characters

    def __init__(self, project: str, experiment: str, config: dict[str, Any] | None) -> None:
        self.mlflow = import_logger_package("mlflow")
        uri = os.environ.get("MLFLOW_TRACKING_URI", MLFLOW_DEFAULT_URI)
        try:
            self.mlflow.set_tracking_uri(uri)
            run_id = os.environ.get("MLFLOW_RUN_ID")
            if run_id:
                self.mlflow.start_run(run_id=run_id)
            else:
                found = self.mlflow.set_experiment(project)
                self.mlflow.start_run(experiment_id=found.experiment_id, run_name=experiment)
            if config:
                self.mlflow.log_params({self.key(k): v for k, v in flatten(config).items()})
        except Exception as error:
            raise RuntimeError(f"trainer.logger 'mlflow': cannot start a run at MLFLOW_TRACKING_URI={uri} ({error}); "
                               "set MLFLOW_TRACKING_URI to a reachable server (http://host:port) or a local "
                               "store (sqlite:///<file>, which needs the full mlflow package)") from error

    @classmethod
    def key(cls, name: str) -> str:
        """``pass@4/acc`` -> ``pass_at_4/acc``: mlflow refuses other characters (verl's mapping)."""
        return cls._INVALID.sub("_", re.sub(r"/+", "/", name.replace("@", "_at_")))

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        numbers = {self.key(k): n for k, v in metrics.items() if (n := _number(v)) is not None}
        try:
            self.mlflow.log_metrics(numbers, step=step)
        except Exception as error:  # a flaky server must not end training; metrics.jsonl has the step
            log.warning("mlflow: step %d not logged (%s); it is in metrics.jsonl", step, error)

    def close(self) -> None:
        self.mlflow.end_run()


class SwanlabLogger:
    """A SwanLab run (verl's settings): ``$SWANLAB_API_KEY`` logs in, ``$SWANLAB_LOG_DIR`` (``swanlog``)
    holds local files, ``$SWANLAB_MODE`` (``cloud``; ``local``/``offline`` need no account)."""

    def __init__(self, project: str, experiment: str, config: dict[str, Any] | None) -> None:
        self.swanlab = import_logger_package("swanlab")
        api_key = os.environ.get("SWANLAB_API_KEY")
        if api_key:
            self.swanlab.login(api_key)
        self.swanlab.init(project=project, experiment_name=experiment, config={"FRAMEWORK": "megarl", **(config or {})},
                          logdir=os.environ.get("SWANLAB_LOG_DIR", "swanlog"), mode=os.environ.get("SWANLAB_MODE", "cloud"))

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        self.swanlab.log({k: n for k, v in metrics.items() if (n := _number(v)) is not None}, step=step)

    def close(self) -> None:
        self.swanlab.finish()
