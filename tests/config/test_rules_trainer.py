"""Trainer rules: step frequencies, resume, data files."""

from __future__ import annotations

import pytest

from config_testing import issue_for, no_issues


@pytest.mark.parametrize("key", ["trainer.save_freq", "trainer.test_freq"])
@pytest.mark.parametrize("value", [0, -2])
def test_nonsense_frequencies(make, key, value):
    issue_for(make({key: value}), key, "-1")


def test_resume_path_mode_needs_a_path(make):
    issue_for(make({"trainer.resume_mode": "resume_path"}), "trainer.resume_from_path", "resume_mode=resume_path")


def test_resume_path_without_resume_path_mode(make, tmp_path):
    issue_for(make({"trainer.resume_from_path": str(tmp_path)}), "trainer.resume_from_path", "ignored")
    no_issues(make({"trainer.resume_from_path": str(tmp_path), "trainer.resume_mode": "resume_path"}))


def test_resume_path_must_exist(make, tmp_path):
    cfg = make({"trainer.resume_from_path": str(tmp_path / "global_step_3"), "trainer.resume_mode": "resume_path"})
    issue_for(cfg, "trainer.resume_from_path", "does not exist")


def test_missing_data_files(make, tmp_path):
    issue_for(make({"data.train_files": str(tmp_path / "none.parquet")}), "data.train_files", "does not exist")
    issue_for(make({"data.val_files": [str(tmp_path / "val.parquet"), str(tmp_path / "b.parquet")]}), "data.val_files", "b.parquet")


def test_remote_data_files_rejected(make):
    issue_for(make({"data.train_files": "hdfs://data/train.parquet"}), "data.train_files", "not supported")
