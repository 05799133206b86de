"""trainer.logger: verl's mlflow / swanlab / file are accepted; an optional logger whose package is
missing is refused up front, naming the key and the pip package."""

from __future__ import annotations

import pytest

from megarl.config import collect_issues


def test_verl_loggers_are_accepted(make):
    assert not [i for i in collect_issues(make({"trainer.logger": ["console", "file"]})) if i.key == "trainer.logger"]


@pytest.mark.parametrize("name", ["mlflow", "swanlab"])
def test_missing_logger_package_is_refused_up_front(make, monkeypatch, name):
    monkeypatch.setattr("megarl.config.rules.trainer.has_module", lambda module: module != name)
    (issue,) = [i for i in collect_issues(make({"trainer.logger": ["console", name]})) if i.key == "trainer.logger"]
    assert f"'{name}' package, which is not installed" in issue.problem and f"pip install {name}" in issue.fix
    monkeypatch.setattr("megarl.config.rules.trainer.has_module", lambda module: True)
    assert not [i for i in collect_issues(make({"trainer.logger": ["console", name]})) if i.key == "trainer.logger"]
