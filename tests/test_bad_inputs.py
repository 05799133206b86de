"""Every catalogued user mistake (tests/bad_inputs_catalogue.py) fails before Ray or any
worker starts, with a message naming the key / file / row and the fix, and no traceback.

In process: the same steps as `python -m megarl.main_ppo` (override check, Hydra compose,
`megarl.main_ppo.prepare` = schema, demo assets, validation, preflight). Cases marked
`subprocess` also run the real command line (exit code 2, message on stderr, no
"Traceback", the trainer never reached). The README's common-errors section must equal
the table rendered from the cases marked `readme`
(`MEGARL_WRITE_README=1 pytest tests/test_bad_inputs.py -k readme` rewrites it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import DictConfig

from bad_inputs_catalogue import BASE_ARGS, CASES, Case
from megarl.config import ConfigError, Issue, check_override_keys, load_config
from megarl.main_ppo import prepare

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
BEGIN, END = "<!-- common-errors:begin -->", "<!-- common-errors:end -->"
DEMO_SHOWN = "~/.cache/megarl/demo"
_ISSUES: dict[str, tuple[Issue, Path, Path]] = {}  # case id -> (issue, case dir, demo dir)


@pytest.fixture(scope="module")
def demo(demo_dir) -> Path:
    """The session's demo assets (tests/conftest.py; the cases write their broken copies in their own
    dirs), with MEGARL_DEMO_DIR pointing at them for the module."""
    from megarl.data.demo import ensure_demo_assets

    mp = pytest.MonkeyPatch()
    mp.setenv("MEGARL_DEMO_DIR", str(demo_dir))
    mp.delenv("RAY_ADDRESS", raising=False)  # a local Ray is what the cluster cases assume
    ensure_demo_assets(load_config())  # any the default config needs beyond the session's
    yield demo_dir
    mp.undo()


def run_user_path(args: list[str]) -> DictConfig:
    """What `python -m megarl.main_ppo ARGS` does before it starts Ray (megarl.main_ppo.cli/main)."""
    issues = check_override_keys(args)
    if issues:
        raise ConfigError(issues)
    return prepare(load_config(args))


def case_args(case: Case, d: Path, demo: Path) -> list[str]:
    if case.setup is not None:
        case.setup(d, demo)
    own = {a.lstrip("+").split("=", 1)[0] for a in case.args}
    base = [a for a in BASE_ARGS if a.split("=", 1)[0] not in own]
    return base + [a.format(dir=d, demo=demo) for a in case.args]


def matching_issue(error: ConfigError, case: Case) -> Issue:
    """The issue for `case.key`; its text holds every one of `case.words` and a fix."""
    listing = "\n".join(i.format() for i in error.issues)
    found = [i for i in error.issues if i.key == case.key]
    assert found, f"{case.id}: no issue names {case.key}; got:\n{listing}"
    text = "\n".join(i.format() for i in found)
    for word in case.words:
        assert word in text, f"{case.id}: {word!r} not in:\n{text}"
    assert all(i.fix.strip() for i in found), f"{case.id}: an issue without a fix:\n{text}"
    return found[0]


def test_catalogue_size_and_unique_ids():
    ids = [c.id for c in CASES]
    assert len(ids) >= 40 and len(set(ids)) == len(ids)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case_fails_before_workers(case: Case, demo: Path, tmp_path: Path):
    args = case_args(case, tmp_path, demo)
    with pytest.raises(ConfigError) as info:
        run_user_path(args)
    _ISSUES[case.id] = (matching_issue(info.value, case), tmp_path, demo)


SUBPROCESS = [c for c in CASES if c.subprocess]


@pytest.fixture(scope="module", autouse=True)
def command_lines(demo: Path, tmp_path_factory) -> dict[str, subprocess.Popen]:
    """Every `subprocess` case's `python -m megarl.main_ppo` started at once, with the module (each is one
    core's 5-15 s of imports; they share the machine's cores with each other and with the in-process
    cases, which use one), by case id."""
    env = {**os.environ, "MEGARL_DEMO_DIR": str(demo), "OMP_NUM_THREADS": "1"}  # (RAY_ADDRESS unset by `demo`)
    procs = {}
    for case in SUBPROCESS:
        d = tmp_path_factory.mktemp(case.id)
        procs[case.id] = subprocess.Popen(
            [sys.executable, "-m", "megarl.main_ppo", "--config-name=ppo_megatron_trainer", *case_args(case, d, demo),
             f"hydra.run.dir={d / 'hydra'}"], cwd=d, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    yield procs
    for proc in procs.values():
        proc.kill()


@pytest.mark.slow  # one python -m megarl.main_ppo process each (5-15 s)
@pytest.mark.parametrize("case", SUBPROCESS, ids=[c.id for c in SUBPROCESS])
def test_case_through_the_command_line(case: Case, command_lines: dict[str, subprocess.Popen]):
    proc = command_lines[case.id]
    stdout, stderr = proc.communicate(timeout=600)
    out = stdout + stderr
    assert proc.returncode == 2, out
    assert "Traceback" not in out, out
    assert "megarl: invalid megarl config" in stderr, out
    assert case.key in stderr and all(w in stderr for w in case.words), out
    # the trainer was never reached: no resolved config printed, no Ray started
    assert "actor_rollout_ref:" not in stdout and "Started a local Ray instance" not in out, out


def readme_row(issue: Issue, d: Path, demo: Path) -> str:
    head, fix = issue.format().split("\n      fix: ", 1)

    def clean(text: str) -> str:
        return text.replace(str(d), "<dir>").replace(str(demo), DEMO_SHOWN).replace("|", "\\|")

    return f"| `{clean(head)}` | {clean(fix)} |"


def render_common_errors(rows: list[str]) -> str:
    return "\n".join([
        BEGIN,
        "Rendered from the cases of `tests/bad_inputs_catalogue.py` and checked by `tests/test_bad_inputs.py`",
        "(`<dir>` stands for your path). `python -m megarl.main_ppo` prints these and exits with code 2.",
        "",
        "| Message (`megarl: invalid megarl config`) | Fix |",
        "|---|---|",
        *rows,
        END,
    ])


def test_readme_common_errors_match_the_catalogue(demo: Path, tmp_path_factory):
    rows = []
    for case in (c for c in CASES if c.readme):
        if case.id not in _ISSUES:  # run alone (-k readme)
            d = tmp_path_factory.mktemp(case.id)
            with pytest.raises(ConfigError) as info:
                run_user_path(case_args(case, d, demo))
            _ISSUES[case.id] = (matching_issue(info.value, case), d, demo)
        rows.append(readme_row(*_ISSUES[case.id]))
    expected = render_common_errors(rows)
    text = README.read_text()
    assert BEGIN in text and END in text, f"README.md lacks the {BEGIN} ... {END} markers"
    start, end = text.index(BEGIN), text.index(END) + len(END)
    if os.environ.get("MEGARL_WRITE_README") == "1":
        README.write_text(text[:start] + expected + text[end:])
        return
    assert text[start:end] == expected, (
        "README common-errors section differs from the catalogue; rewrite it with "
        "`MEGARL_WRITE_README=1 pytest tests/test_bad_inputs.py -k readme`. Expected:\n" + expected
    )
