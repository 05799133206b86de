"""Reward dict extras: numeric keys become reward/<key>/mean over the rows that returned them,
non-numeric ones are named once per run, never dropped without a word (issue 37 item 7)."""

from __future__ import annotations

import numpy as np
import pytest

from megarl.reward.extra_metrics import extra_metrics


def test_numeric_partial_and_non_numeric_keys(capsys):
    extra = {
        "score": [1.0, 0.0, 1.0, 0.0],
        "timeout": [0.0, 0.0, 0.0, 0.0],
        "acc": [True, False, np.bool_(True), True],
        "format": [1, 0.5, np.float32(0.25), np.int64(2)],
        "bonus": [None, 2.0, None, 4.0],  # returned by rows 1 and 3 only
        "pred": ["12", "7", None, "x"],
        "parsed": [None, None, None, None],
    }
    named: set[str] = set()
    metrics = extra_metrics(extra, named)
    assert metrics == {"reward/acc/mean": pytest.approx(0.75), "reward/format/mean": pytest.approx((1 + 0.5 + 0.25 + 2) / 4),
                       "reward/bonus/mean": pytest.approx(3.0)}
    out = capsys.readouterr().out
    assert out.count("'pred'") == 1 and "str" in out and "'12'" in out and "not logged" in out, out
    assert named == {"pred"}
    extra_metrics(extra, named)  # the next step: not named again
    assert "'pred'" not in capsys.readouterr().out
    mixed = extra_metrics({"acc": [1.0, "yes"]}, set())  # one non-number makes the key non-numeric
    assert mixed == {} and "'acc'" in capsys.readouterr().out
