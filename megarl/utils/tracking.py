"""Metric sinks named by ``trainer.logger``: console, tensorboard, wandb, and (megarl.utils.tracking_backends)
verl's file, mlflow and swanlab; the optional packages are imported only when named.

``Tracking(cfg).log(metrics, step)`` writes one step to every sink. The jsonl file
(``<default_local_dir>/metrics.jsonl`` unless given) holds one JSON object per logged step
with every metric; ``megarl.utils.plot_curve`` reads it.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, Mapping

from megarl.config.names import LOGGERS
from megarl.utils.tracking_backends import FileLogger, MlflowLogger, SwanlabLogger, import_logger_package


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class JsonlLogger:
    def __init__(self, path: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.path = path
        self.handle = open(path, "a")

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        record = {"step": int(step), **{k: _plain(v) for k, v in metrics.items()}}
        self.handle.write(json.dumps(record) + "\n")
        self.handle.flush()

    def close(self) -> None:
        self.handle.close()


class ConsoleLogger:
    """A progress line per step: step/total, ETA, reward, the slowest phases."""

    def __init__(self, total_steps: int | None = None, stream=None) -> None:
        self.total = total_steps
        self.stream = stream or sys.stdout
        self.start = time.monotonic()
        self.first_step: int | None = None

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        if self.first_step is None:
            self.first_step = step
            self.start = time.monotonic()
        parts = [f"step {step}" + (f"/{self.total}" if self.total else "")]
        done = step - self.first_step
        if self.total and done > 0:
            per_step = (time.monotonic() - self.start) / done
            parts.append(f"ETA {_clock(per_step * (self.total - step))}")
        for key, label in (("critic/score/mean", "score"), ("val/reward/mean", "val"),
                           ("response_length/mean", "len"), ("perf/tokens_per_s", "tok/s")):
            if key in metrics:
                parts.append(f"{label} {float(metrics[key]):.3g}")
        phases = sorted(((k, float(v)) for k, v in metrics.items() if k.startswith("timing_s/") and k != "timing_s/step"),
                        key=lambda kv: -kv[1])[:4]
        if "timing_s/step" in metrics:
            parts.append(f"{float(metrics['timing_s/step']):.1f}s/step")
        if phases:
            parts.append("(" + " ".join(f"{k[9:]} {v:.1f}s" for k, v in phases) + ")")
        print("[megarl] " + " | ".join(parts), file=self.stream, flush=True)

    def close(self) -> None:
        pass


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class TensorboardLogger:
    def __init__(self, log_dir: str) -> None:
        import_logger_package("tensorboard")  # torch.utils.tensorboard needs it
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for key, value in metrics.items():
            value = _plain(value)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """wandb.init(project, name, config); WANDB_MODE=offline works without network."""

    def __init__(self, project: str, name: str, config: dict[str, Any] | None, directory: str) -> None:
        wandb = import_logger_package("wandb")
        os.makedirs(directory, exist_ok=True)
        self.run = wandb.init(project=project, name=name, config=config, dir=directory)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        self.run.log({k: _plain(v) for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        self.run.finish()


class Tracking:
    """All sinks of ``loggers``; jsonl is always on (``jsonl_path``) so every run has a record."""

    def __init__(
        self,
        loggers: list[str],
        *,
        project: str,
        experiment: str,
        log_dir: str,
        total_steps: int | None = None,
        config: dict[str, Any] | None = None,
        jsonl_path: str | None = None,
    ) -> None:
        unknown = [name for name in loggers if name not in LOGGERS]
        if unknown:
            raise ValueError(f"trainer.logger: unknown logger(s) {unknown}; choose from {list(LOGGERS)}")
        self.sinks: list[Any] = [JsonlLogger(jsonl_path or os.path.join(log_dir, "metrics.jsonl"))]
        if "console" in loggers:
            self.sinks.append(ConsoleLogger(total_steps))
        if "tensorboard" in loggers:
            self.sinks.append(TensorboardLogger(os.environ.get("TENSORBOARD_DIR") or os.path.join(log_dir, "tensorboard")))
        if "wandb" in loggers:
            self.sinks.append(WandbLogger(project, experiment, config, os.path.join(log_dir, "wandb")))
        if "mlflow" in loggers:
            self.sinks.append(MlflowLogger(project, experiment, config))
        if "swanlab" in loggers:
            self.sinks.append(SwanlabLogger(project, experiment, config))
        if "file" in loggers:
            self.sinks.append(FileLogger(project, experiment))

    @property
    def jsonl_path(self) -> str:
        return self.sinks[0].path

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for sink in self.sinks:
            sink.log(metrics, step)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def dump_generations(directory: str, step: int, rows: dict[str, list[Any]]) -> str:
    """Write ``rows`` (columns of equal length: input, output, score, ...) to ``<dir>/<step>.jsonl``."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{step}.jsonl")
    keys = list(rows)
    n = len(rows[keys[0]]) if keys else 0
    with open(path, "w") as handle:
        for i in range(n):
            handle.write(json.dumps({k: _plain(rows[k][i]) for k in keys}, default=str) + "\n")
    return path
