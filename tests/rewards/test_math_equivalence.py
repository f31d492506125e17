"""Math equivalence: quick exact checks and math-verify in a bounded worker process."""

import threading

import pytest

from rz_agents.rewards import MathVerifier, math_reward
from rz_agents.rewards.equivalence import quick_equal


@pytest.fixture(scope="module")
def verifier():
    v = MathVerifier(workers=1, timeout_s=20.0)
    yield v
    v.close()


@pytest.mark.parametrize(
    "pred, gold, expected",
    [("42", "42", True), ("0.5", "1/2", True), ("1,000", "1000", True), ("3", "4", False), ("x", "y", None)],
)
def test_quick_equal_decides_plain_numbers_without_math_verify(pred, gold, expected):
    assert quick_equal(pred, gold) is expected


def test_huge_exponent_is_not_evaluated_by_the_quick_path():
    assert quick_equal("1e999999999", "1") is None


@pytest.mark.parametrize(
    "pred, gold, expected",
    [
        (r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}", True),
        ("x + 1", "1 + x", True),
        (r"\pi", "3.14159", False),
        (r"(1, 2)", r"(1,2)", True),
        ("2x", "3x", False),
        ("garbage {{", "7", False),
    ],
)
def test_math_verify_equivalence(verifier, pred, gold, expected):
    assert verifier.equal(pred, gold) is expected


def test_a_check_over_the_time_bound_is_false_and_the_worker_is_replaced(verifier):
    assert verifier.equal("x+1", "1+x")  # warm
    before = verifier.timeouts
    assert verifier.equal(r"\sqrt{8}", r"2\sqrt{2}", timeout_s=1e-6) is False
    assert verifier.timeouts == before + 1
    assert verifier.equal(r"\sqrt{8}", r"2\sqrt{2}") is True


def test_safe_to_call_from_many_threads(verifier):
    results = {}

    def check(i):
        results[i] = verifier.equal(f"{i} + x", f"x + {i}")

    threads = [threading.Thread(target=check, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: True for i in range(6)}


def test_math_reward_is_zero_one_with_optional_format_penalty(verifier):
    assert math_reward(r"so \boxed{1788}", "1788", verifier=verifier) == 1.0
    assert math_reward(r"so \boxed{1789}", "1788", verifier=verifier) == 0.0
    assert math_reward("1788", "1788", verifier=verifier) == 0.0
    assert math_reward("1788", "1788", format_penalty=0.1, verifier=verifier) == -0.1
