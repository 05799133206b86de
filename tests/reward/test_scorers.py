"""Rule scorers on hand-made strings, and default_compute_score dispatch by data_source."""

import pytest

from megarl.reward import default_compute_score
from megarl.reward import gsm8k, math_boxed
from megarl.reward.demo_task import DATA_SOURCE


@pytest.mark.parametrize("text,truth,expected", [
    ("so 3+4 = 7\n#### 7", "7", 1.0),
    ("#### 1,234", "1234", 1.0),
    ("#### 72.", "72", 1.0),
    ("#### 3.50", "3.5", 1.0),
    ("the answer is #### 8", "7", 0.0),
    ("the answer is 7", "7", 0.0),            # strict needs ####
    ("#### 5 ... wait #### 7", "7", 1.0),     # the last #### counts
    ("#### -3", "-3", 1.0),
])
def test_gsm8k_strict(text, truth, expected):
    assert gsm8k.compute_score(text, truth) == expected


def test_gsm8k_flexible_and_format_score():
    assert gsm8k.compute_score("I think it is 12, no 13", "13", method="flexible") == 1.0
    assert gsm8k.compute_score("#### 4", "5", format_score=0.1) == 0.1
    assert gsm8k.extract_solution("no numbers", "flexible") is None


@pytest.mark.parametrize("text,truth,expected", [
    (r"thus $\boxed{42}$", "42", 1.0),
    (r"$\boxed{\dfrac{1}{2}}$", r"\frac{1}{2}", 1.0),
    (r"\boxed{\frac12}", r"\frac{1}{2}", 1.0),
    (r"\boxed{x = 5}", "5", 1.0),
    (r"\boxed{90^\circ}", "90", 1.0),
    (r"\boxed{\left( 1, 2 \right)}", "(1,2)", 1.0),
    (r"\boxed{\text{(B)}}", "(B)", 1.0),
    (r"\boxed{1,000}", "1000", 1.0),
    (r"\boxed{3} then \boxed{4}", "4", 1.0),
    (r"\boxed{3}", "4", 0.0),
    ("no box 42", "42", 0.0),
    (r"\boxed{\frac{1}{2}", "1/2", 0.0),  # unbalanced
])
def test_math_boxed(text, truth, expected):
    assert math_boxed.compute_score(text, truth) == expected


def test_math_boxed_ground_truth_may_be_boxed():
    assert math_boxed.compute_score(r"\boxed{7}", r"\boxed{7}") == 1.0
    assert math_boxed.last_boxed(r"a \boxed{{x}^{2}} b") == "{x}^{2}"


def test_default_dispatch_by_data_source():
    assert default_compute_score("openai/gsm8k", "#### 3", "3") == 1.0
    assert default_compute_score("lighteval/MATH", r"\boxed{3}", "3") == 1.0
    assert default_compute_score(DATA_SOURCE, " -2", "-2") == 1.0
    assert default_compute_score(DATA_SOURCE, "2", "-2") == 0.0
    with pytest.raises(ValueError, match="data_source='my/data'.*custom_reward_function.path"):
        default_compute_score("my/data", "x", "y")
