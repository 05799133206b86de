"""README's exit-code table, megarl's code and the tests agree: every documented code is one the
driver can exit with, and each has a test that runs the real entry point into it (issue 37 item 6)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# code -> (test file, the test function or its helper) that asserts `python -m megarl.main_ppo` exits with it
TESTED_BY = {
    0: ("tests/fault/test_kill_resume.py", "_resume_twice"),  # the resumed run ends with 0
    1: ("tests/trainer/test_failures.py", "test_checkpoint_lock_config_and_unknown_errors_have_their_codes"),  # no way to cause a megarl bug on purpose
    2: ("tests/config/test_main.py", "test_bad_type_exits_2_with_clean_message"),
    3: ("tests/fault/test_reliability_e2e.py", "test_3_damage_lock_and_model_changes_fail_before_ray"),
    4: ("tests/fault/test_reliability_e2e.py", "test_3_damage_lock_and_model_changes_fail_before_ray"),
    5: ("tests/fault/test_reliability_e2e.py", "test_reward_exception_in_validation_is_one_message_with_the_sample"),
    6: ("tests/fault/test_reliability_e2e.py", "test_disk_full_during_save_is_named_and_leaves_no_partial_step"),
    7: ("tests/fault/test_worker_killed.py", "test_worker_killed_mid_step_stops_the_run_naming_it"),
    130: ("tests/fault/test_signals.py", "test_ctrl_c_prints_one_line_instead_of_a_traceback"),
    143: ("tests/fault/test_signals.py", "test_sigterm_exits_143_after_cleanup"),
}


def readme_codes() -> dict[int, str]:
    text = (REPO / "README.md").read_text()
    table = text.split("Exit codes of `python -m megarl.main_ppo`:", 1)[1]
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^\| (\d+) \| (.+) \|$", table.split("\n\n## ", 1)[0], re.M)}


def test_readme_table_is_the_codes_megarl_exits_with():
    from megarl.trainer import failures
    from megarl.utils.signals import EXIT_SIGTERM

    documented = readme_codes()
    constants = {v for k, v in vars(failures).items() if k.startswith("EXIT_") and isinstance(v, int)}
    assert set(documented) == {0} | constants | {EXIT_SIGTERM}, documented
    docstring = {int(m.group(1)) for m in re.finditer(r"^\s+(\d+)  ", failures.__doc__, re.M)}
    assert docstring == set(documented) - {0}, docstring
    assert set(TESTED_BY) == set(documented)


def _function_source(path: Path, name: str) -> str:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(path.read_text(), node)
    raise AssertionError(f"{path}: no test {name}")


def test_every_documented_code_has_a_test_asserting_it():
    for code, (file, name) in TESTED_BY.items():
        source = _function_source(REPO / file, name)
        assert re.search(rf"(==|, ) ?{code}\b", source), f"{file}::{name} does not assert exit code {code}"
