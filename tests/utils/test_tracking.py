"""Metric sinks: jsonl (one line per step, every metric), console line, plot_curve."""

import io
import json
import sys

import pytest

from megarl.utils.plot_curve import plot, read_curve
from megarl.utils.tracking import ConsoleLogger, Tracking, dump_generations


def test_jsonl_one_line_per_step_with_all_metrics(tmp_path):
    t = Tracking(["console"], project="p", experiment="e", log_dir=str(tmp_path), total_steps=3)
    t.log({"val/reward/mean": 0.1}, step=0)
    t.log({"critic/score/mean": 0.5, "timing_s/gen": 1.25, "perf/tokens_per_s": 100}, step=1)
    t.log({"critic/score/mean": 0.7, "val/reward/mean": 0.4, "x": float("nan")}, step=2)
    t.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert records[1] == {"step": 1, "critic/score/mean": 0.5, "timing_s/gen": 1.25, "perf/tokens_per_s": 100}
    assert records[2]["x"] == "nan"
    assert read_curve(str(tmp_path / "metrics.jsonl"), "val/reward/mean") == ([0, 2], [0.1, 0.4])
    png = plot(str(tmp_path / "metrics.jsonl"), str(tmp_path / "curve.png"))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no records"):
        plot(str(tmp_path / "metrics.jsonl"), str(tmp_path / "c2.png"), ("missing",))


def test_console_line_has_progress_reward_and_phases():
    out = io.StringIO()
    c = ConsoleLogger(total_steps=10, stream=out)
    c.log({"critic/score/mean": 0.25, "timing_s/step": 2.0, "timing_s/gen": 1.5, "timing_s/update_actor": 0.4}, 1)
    c.log({"critic/score/mean": 0.5, "timing_s/step": 2.0}, 2)
    first, second = out.getvalue().splitlines()
    assert "step 1/10" in first and "score 0.25" in first and "gen 1.5s" in first and "update_actor 0.4s" in first
    assert "step 2/10" in second and "ETA" in second


def test_unknown_logger_is_named(tmp_path):
    with pytest.raises(ValueError, match="trainer.logger.*'clearml'"):
        Tracking(["console", "clearml"], project="p", experiment="e", log_dir=str(tmp_path))


def test_file_logger_writes_verls_layout(tmp_path, monkeypatch):
    """verl's FileLogger: $VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl, {"step", "data"} per line."""
    monkeypatch.delenv("VERL_FILE_LOGGER_PATH", raising=False)
    monkeypatch.setenv("VERL_FILE_LOGGER_ROOT", str(tmp_path / "root"))
    t = Tracking(["file"], project="p", experiment="e", log_dir=str(tmp_path / "run"))
    t.log({"critic/score/mean": 0.5, "n": 3, "x": float("nan"), "note": "text"}, step=1)
    t.log({"critic/score/mean": 0.75}, step=2)
    t.close()
    lines = (tmp_path / "root" / "p" / "e.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"step": 1, "data": {"critic/score/mean": 0.5, "n": 3.0, "x": None, "note": "text"}},
        {"step": 2, "data": {"critic/score/mean": 0.75}},
    ]
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "exact.jsonl"))  # verl's explicit path wins
    for step in (3, 4):  # two runs: the second appends
        t = Tracking(["file"], project="p", experiment="e", log_dir=str(tmp_path / "run"))
        t.log({"a": step}, step=step)
        t.close()
    assert [json.loads(line)["step"] for line in (tmp_path / "exact.jsonl").read_text().splitlines()] == [3, 4]
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 4  # megarl's own record stays on


@pytest.mark.parametrize("name", ["mlflow", "swanlab", "wandb", "tensorboard"])
def test_missing_logger_package_names_key_and_package(tmp_path, monkeypatch, name):
    monkeypatch.setitem(sys.modules, name, None)  # import of `name` raises ImportError
    with pytest.raises(ImportError, match=f"trainer.logger includes '{name}'.*pip install {name}"):
        Tracking([name], project="p", experiment="e", log_dir=str(tmp_path), config={"a": 1})


def test_mlflow_run_has_config_and_metrics(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())  # works with mlflow-skinny (no sqlite)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    t = Tracking(["mlflow"], project="proj", experiment="exp", log_dir=str(tmp_path),
                 config={"trainer": {"project_name": "proj", "logger": ["mlflow"]}, "data": {"train_batch_size": 4}})
    t.log({"critic/score/mean": 0.5, "val/pass@4": 1.0, "note": "text"}, step=1)
    t.log({"critic/score/mean": 0.25}, step=2)
    run_id = mlflow.active_run().info.run_id
    t.close()
    client = mlflow.tracking.MlflowClient()
    run = client.get_run(run_id)
    assert run.info.run_name == "exp" and client.get_experiment(run.info.experiment_id).name == "proj"
    assert run.data.params == {"trainer/project_name": "proj", "trainer/logger/list_len": "1", "trainer/logger/0": "mlflow",
                               "data/train_batch_size": "4"}
    history = client.get_metric_history(run_id, "critic/score/mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.5), (2, 0.25)]
    assert run.data.metrics["val/pass_at_4"] == 1.0 and "note" not in run.data.metrics


def test_dump_generations(tmp_path):
    path = dump_generations(str(tmp_path / "gens"), 3, {"input": ["a", "b"], "output": ["1", "2"], "score": [1.0, 0.0]})
    rows = [json.loads(line) for line in open(path)]
    assert rows == [{"input": "a", "output": "1", "score": 1.0}, {"input": "b", "output": "2", "score": 0.0}]


def test_tensorboard_and_wandb_offline(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    t = Tracking(["tensorboard", "wandb"], project="p", experiment="e", log_dir=str(tmp_path), config={"a": 1})
    t.log({"critic/score/mean": 0.5, "note": "text"}, step=1)
    t.close()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("critic/score/mean")] == [(1, 0.5)]
    assert list((tmp_path / "wandb").rglob("*.wandb")), "no offline wandb run file"
