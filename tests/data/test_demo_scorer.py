"""megarl.reward.demo_task.compute_score on hand-made strings."""

import pytest

from megarl.reward.demo_task import compute_score


@pytest.mark.parametrize(
    "response, truth, score",
    [
        ("9", "9", 1.0),
        (" 9 3 1", "9", 1.0),
        ("93", "9", 1.0),  # only the first character counts
        ("\n7", "7", 1.0),
        ("8", "9", 0.1),
        ("0 9", "9", 0.1),
        ("", "9", 0.0),
        ("   ", "9", 0.0),
        ("largest 9", "9", 0.0),
        (":9", "9", 0.0),
        ("<reserved_3>9", "9", 0.0),
        ("9", " 9 ", 1.0),
    ],
)
def test_compute_score(response, truth, score):
    assert compute_score(response, truth) == score
