"""verl's `--config-path` / `--config-name` forms select megarl's config in `main_ppo`, `--dry-run` and
`megarl.plan`; a directory or name that is not verl's trainer config is refused by option.

Each accepted form is run with one bad override (`trainer.total_training_steps=abc`): the run must
get past the options to that key's message. An ignored option would stop it earlier (argparse's
"unrecognized arguments", Hydra's "Cannot find primary config"); an ignored refusal would reach it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from megarl.config.config_options import take_config_options
from megarl.plan.__main__ import main as plan_main

REPO = Path(__file__).resolve().parents[2]  # this checkout's megarl, whatever the venv's editable install points at
BAD_KEY = "trainer.total_training_steps=abc"
BAD_KEY_MESSAGE = "trainer.total_training_steps = 'abc'"
FORMS = [
    ["--config-path=config", "--config-name=ppo_megatron_trainer.yaml"],  # verl's GRPO / DAPO scripts
    ["--config-path=./config", "--config-name='ppo_megatron_trainer.yaml'"],
    ["--config-path", "config", "--config-name", "ppo_megatron_trainer"],
    ["-cp", "./config", "-cn", "ppo_megatron_trainer"],
    ["--config-path=/opt/verl/verl/trainer/config", "--config-name=ppo_megatron_trainer"],
]
REFUSED = [
    (["--config-name=ppo_trainer"], "--config-name"),  # verl's FSDP trainer config
    (["--config-path=/my/recipe/config", "--config-name=ppo_megatron_trainer"], "--config-path"),
    (["-cn", "dapo_megatron_trainer.yaml"], "-cn"),
]


def _main_ppo(args: list[str], cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "MEGARL_DEMO_DIR": str(cwd / "demo"), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "megarl.main_ppo", *args, f"hydra.run.dir={cwd / 'hydra'}"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("form", FORMS, ids=lambda f: " ".join(f))
def test_plan_takes_verls_config_options(form, capsys):
    assert plan_main([*form, BAD_KEY]) == 2
    assert BAD_KEY_MESSAGE in capsys.readouterr().err


@pytest.mark.parametrize("form, option", REFUSED)
def test_plan_refuses_another_config_by_option(form, option, capsys):
    assert plan_main(form) == 2
    err = capsys.readouterr().err
    assert f"{option} = " in err and "fix:" in err, err


@pytest.mark.parametrize("form", [FORMS[1], FORMS[3]], ids=lambda f: " ".join(f))
def test_main_ppo_takes_verls_config_options(form, tmp_path):
    """From a directory without a config/ (verl's scripts run from verl's checkout)."""
    proc = _main_ppo([*form, BAD_KEY], tmp_path)
    assert proc.returncode == 2 and BAD_KEY_MESSAGE in proc.stderr, proc.stdout + proc.stderr


def test_dry_run_takes_verls_config_options(tmp_path):
    proc = _main_ppo(["--dry-run", *FORMS[0], BAD_KEY], tmp_path)
    assert proc.returncode == 2 and BAD_KEY_MESSAGE in proc.stderr, proc.stdout + proc.stderr


def test_main_ppo_refuses_another_config_by_option(tmp_path):
    proc = _main_ppo([*REFUSED[1][0], BAD_KEY], tmp_path)
    assert proc.returncode == 2 and "--config-path = '/my/recipe/config'" in proc.stderr, proc.stdout + proc.stderr
    assert BAD_KEY_MESSAGE not in proc.stderr  # stops at the option, before composing


def test_options_are_taken_out_and_the_rest_kept_in_order():
    rest, issues = take_config_options(["a=1", "-cp", "config", "b=2", "--config-name", "ppo_megatron_trainer", "c=3"])
    assert rest == ["a=1", "b=2", "c=3"] and issues == []
    _, issues = take_config_options(["--config-name"])
    assert [i.key for i in issues] == ["--config-name"]
