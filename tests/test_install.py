"""megarl installs like a library: a wheel built from a copy of the source, installed into a fresh
venv, finds its Hydra configs inside the package and runs the quickstart entry point from a
directory that is not the repo (no PYTHONPATH, no editable install).

The fresh venv gets the heavy dependencies (torch, megatron-core, vLLM, Ray) by a `.pth` line
naming this interpreter's site-packages: a path line adds that directory to `sys.path` without
running its `.pth` files, so the repo's editable megarl there stays inactive and the wheel's
megarl (in the venv's own site-packages, earlier on `sys.path`) is the one imported.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
WHEEL_SOURCES = ("setup.py", "pyproject.toml", "README.md", "megarl")


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(venv dir, a working dir outside the repo) with the wheel of the current source installed."""
    root = tmp_path_factory.mktemp("install")
    src = root / "src"
    src.mkdir()
    for name in WHEEL_SOURCES:
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy2
        copy(REPO / name, src / name, **({"ignore": shutil.ignore_patterns("__pycache__")} if (REPO / name).is_dir() else {}))
    dist = root / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), str(src)],
                   check=True, timeout=300)
    (wheel,) = dist.glob("megarl-*.whl")

    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(subprocess.run([_venv_python(venv), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "heavy_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(_venv_python(venv)), "install", "-q", "--no-deps",
                    "--no-index", "--force-reinstall", str(wheel)], check=True, timeout=300)
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    return venv, elsewhere


def _run(venv: Path, cwd: Path, *argv: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"MEGARL_DEMO_DIR": str(cwd / "demo"), "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"})
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_wheel_ships_the_configs_and_imports_from_the_venv(installed):
    venv, elsewhere = installed
    proc = _run(venv, elsewhere, str(_venv_python(venv)), "-c",
                "import megarl, megarl.config as c, os; print(megarl.__file__); print(c.CONFIG_DIR); "
                "print(sorted(os.listdir(c.CONFIG_DIR)) + sorted(os.listdir(os.path.dirname(c.CONFIG_DIR))))")
    assert proc.returncode == 0, proc.stderr
    module, config_dir, listing = proc.stdout.strip().splitlines()
    assert module.startswith(str(venv)) and config_dir.startswith(str(venv)), proc.stdout
    assert all(name in listing for name in ("ppo_megatron_trainer.yaml", "profiles", "generation.yaml", "evaluation.yaml"))


def test_console_script_composes_the_config(installed):
    venv, elsewhere = installed
    proc = _run(venv, elsewhere, str(venv / "bin" / "megarl-ppo"), "--help")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "actor_rollout_ref" in proc.stdout and "adv_estimator" in proc.stdout  # Hydra's help shows the composed yaml
    bad = _run(venv, elsewhere, str(_venv_python(venv)), "-m", "megarl.main_ppo", "trainer.total_training_step=3")
    assert bad.returncode == 2 and "did you mean trainer.total_training_steps" in bad.stderr, bad.stdout + bad.stderr


@pytest.mark.extended  # ~85 s on 2 cores; the two tests above run in the default suite
def test_quickstart_runs_one_step_from_the_wheel(installed):
    venv, elsewhere = installed
    run_dir = elsewhere / "run"
    proc = _run(venv, elsewhere, str(venv / "bin" / "megarl-ppo"),
                "trainer.device=cpu", "ray_kwargs.ray_init.num_cpus=2", "trainer.logger=[console,file]",
                f"trainer.default_local_dir={run_dir}", "trainer.val_before_train=false", "trainer.test_freq=-1",
                "trainer.save_freq=-1", "trainer.total_training_steps=1", "data.train_batch_size=4",
                "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", f"hydra.run.dir={elsewhere / 'hydra'}",
                timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1], steps
    # verl's file logger: <cwd>/<project_name>/<experiment_name>.jsonl (the demo's megarl/demo_grpo)
    verl_file = elsewhere / "megarl" / "demo_grpo.jsonl"
    (record,) = [json.loads(line) for line in verl_file.read_text().splitlines()]
    assert record["step"] == 1 and "actor/pg_loss" in record["data"]
