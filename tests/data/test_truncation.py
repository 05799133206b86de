"""truncate_prompt on hand-made id lists."""

import pytest

from megarl.data.truncation import PromptTooLong, truncate_prompt

IDS = list(range(10))


@pytest.mark.parametrize(
    "mode, max_length, expected",
    [
        ("left", 4, [6, 7, 8, 9]),
        ("right", 4, [0, 1, 2, 3]),
        ("middle", 4, [0, 1, 8, 9]),
        ("middle", 5, [0, 1, 7, 8, 9]),
        ("middle", 1, [9]),
        ("error", 10, IDS),
        ("left", 12, IDS),
    ],
)
def test_modes(mode, max_length, expected):
    assert truncate_prompt(IDS, max_length, mode) == expected


def test_error_mode_and_unknown_mode():
    with pytest.raises(PromptTooLong, match="10 tokens > data.max_prompt_length=9"):
        truncate_prompt(IDS, 9, "error")
    with pytest.raises(ValueError, match="data.truncation must be one of"):
        truncate_prompt(IDS, 4, "both")
