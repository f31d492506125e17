"""Final-answer extraction from completions."""

import pytest

from rz_agents.rewards import extract_boxed, normalize_answer


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"The answer is \boxed{42}.", "42"),
        (r"first \boxed{1} then \boxed{2}", "2"),
        (r"\boxed{\frac{1}{\sqrt{2}}}", r"\frac{1}{\sqrt{2}}"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
        (r"$\boxed 7$", "7"),
        (r"\fbox{x+1} and later \boxed{y}", "y"),
        (r"\boxed{ 12 }", "12"),
        (r"\boxed{3} and an unfinished \boxed{4", "3"),
        ("no box here", None),
        (r"\boxed{unbalanced", None),
        ("", None),
    ],
)
def test_extract_boxed_takes_the_last_complete_box(text, expected):
    assert extract_boxed(text) == expected


def test_extract_boxed_rejects_non_strings():
    assert extract_boxed(None) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "raw, norm",
    [("1,000", "1000"), (r"\text{5 apples}", "5apples"), ("$ 3 $.", "3"), (r"\dfrac{1}{2}", r"\frac{1}{2}")],
)
def test_normalize_answer(raw, norm):
    assert normalize_answer(raw) == norm
