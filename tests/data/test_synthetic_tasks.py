"""The synthetic arithmetic generator: deterministic, correct, difficulty-scaled."""

import re

import pytest

from rz_agents.data import generate_arithmetic_tasks


def test_same_seed_same_tasks_and_different_seed_differs():
    assert generate_arithmetic_tasks(20, seed=3) == generate_arithmetic_tasks(20, seed=3)
    assert generate_arithmetic_tasks(20, seed=3) != generate_arithmetic_tasks(20, seed=4)


@pytest.mark.parametrize("difficulty", [1, 2, 3, 4, 6])
def test_answers_are_exact_integers_of_the_compact_question(difficulty):
    for task in generate_arithmetic_tasks(50, seed=1, difficulty=difficulty):
        m = re.fullmatch(r"Compute ([0-9+\-*() ]+)\.", task["question"])
        assert m, task
        assert int(task["answer"]) == eval(m.group(1))  # independent check of the stored answer


def test_difficulty_grows_expression_size():
    mean_len = [
        sum(len(t["expression"]) for t in generate_arithmetic_tasks(100, seed=0, difficulty=d)) / 100
        for d in (1, 2, 3, 5)
    ]
    assert mean_len == sorted(mean_len)


def test_ids_are_unique_and_bad_arguments_rejected():
    tasks = generate_arithmetic_tasks(100, seed=0)
    assert len({t["id"] for t in tasks}) == 100
    with pytest.raises(ValueError):
        generate_arithmetic_tasks(5, difficulty=0)
