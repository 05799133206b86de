"""megarl.reward.demo_task.compute_score on hand-made strings."""

import pytest

from megarl.reward.demo_task import compute_score


@pytest.mark.parametrize(
    "response, truth, score",
    [
        ("-2", "-2", 1.0),
        (" -2", "-2", 1.0),  # surrounding whitespace is not part of the answer
        ("13\n", "13", 1.0),
        ("5", " 5 ", 1.0),
        ("2", "-2", 0.0),  # the sign matters
        ("3", "13", 0.0),  # so does the tens digit
        ("13 1", "13", 0.0),  # anything after the answer makes it wrong
        ("131", "13", 0.0),
        ("-02", "-2", 0.0),
        ("- 2", "-2", 0.0),
        ("", "0", 0.0),
        ("   ", "0", 0.0),
        ("<reserved_3>5", "5", 0.0),
    ],
)
def test_compute_score(response, truth, score):
    assert compute_score(response, truth) == score
