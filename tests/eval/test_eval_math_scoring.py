"""Scoring scripted completions: the last \\boxed{} against the gold answer, with math equivalence."""

import pytest

from rz_agents.eval.math_scoring import ProblemResult, SampleResult, score_completion, summarize


def test_right_answer_is_correct():
    s = score_completion("6 * 7 = 42, so the answer is \\boxed{42}.", "42")
    assert s.correct and s.answer == "42" and s.error is None


def test_wrong_answer_is_wrong_and_keeps_the_answer():
    s = score_completion("The answer is \\boxed{41}.", "42")
    assert not s.correct and s.answer == "41"


def test_no_boxed_answer_is_wrong_with_no_answer():
    s = score_completion("The answer is 42.", "42")
    assert not s.correct and s.answer is None


def test_an_empty_box_echoing_the_instruction_is_no_answer():
    s = score_completion("Put your final answer within \\boxed{}.", "42")
    assert not s.correct and s.answer is None


def test_the_last_of_several_boxed_answers_counts():
    text = "First guess \\boxed{3}. Wait, recheck: \\boxed{5}"
    assert score_completion(text, "5").correct
    assert not score_completion(text, "3").correct


@pytest.mark.parametrize("pred", ["1/2", "0.5", "\\frac{1}{2}", "\\dfrac{1}{2}", "\\frac12"])
def test_equivalent_forms_of_one_half_are_correct(pred):
    assert score_completion(f"\\boxed{{{pred}}}", "\\frac{1}{2}").correct
    assert score_completion(f"so \\boxed{{{pred}}}", "0.5").correct


def test_nested_braces_and_thousands_separators():
    assert score_completion("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}").correct
    assert score_completion("\\boxed{70,000}", "70000").correct
    assert not score_completion("\\boxed{\\frac{1}{3}}", "0.5").correct


def _problem(pid, gold, answers, correct):
    return ProblemResult(
        pid, gold, [SampleResult(a, c, tokens=10) for a, c in zip(answers, correct, strict=True)]
    )


def test_summary_arithmetic_and_most_frequent_answer():
    problems = [
        _problem("p0", "2", ["2", "3", "2", None], [True, False, True, False]),
        _problem("p1", "7", [None, None, "1", "1"], [False, False, False, False]),
    ]
    out = summarize(problems, k=4)
    assert out["avg_at_k"] == pytest.approx((2 / 4 + 0) / 2)
    assert out["pass_at_k"] == pytest.approx(0.5)
    assert out["num_correct"] == 2 and out["num_samples"] == 8 and out["num_problems"] == 2
    assert out["no_answer_rate"] == pytest.approx(3 / 8)
    assert problems[0].top_answer() == "2" and problems[1].top_answer() == "1"
    row = problems[0].to_dict()
    assert row["num_correct"] == 2 and row["num_samples"] == 4 and len(row["samples"]) == 4


def test_failed_samples_are_counted_and_scored_wrong():
    p = ProblemResult(
        "p", "1", [SampleResult(None, False, finish="error", error="boom"), SampleResult("1", True)]
    )
    out = summarize([p], k=2)
    assert out["num_failed"] == 1 and out["avg_at_k"] == 0.5 and out["pass_at_k"] == 1.0
