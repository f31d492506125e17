"""The GSM8K-style word-problem generator: deterministic, exact answers, and its held-out set."""

import random
import re

import pytest

from rz_agents.data import load_dataset
from rz_agents.data.loader import WORD_PROBLEMS_HELDOUT
from rz_agents.data.word_problems import TEMPLATES, generate_word_problems, word_problem


def test_same_seed_same_problems_and_other_seed_others():
    a = generate_word_problems(30, seed=3)
    assert a == generate_word_problems(30, seed=3)
    assert a != generate_word_problems(30, seed=4)
    assert len({t["id"] for t in a}) == 30


@pytest.mark.parametrize("difficulty", [1, 2])
def test_answers_are_the_expression_over_the_numbers_of_the_story(difficulty):
    tasks = generate_word_problems(400, seed=0, difficulty=difficulty)
    for t in tasks:
        value = eval(t["expression"], {"__builtins__": {}}, {})  # noqa: S307 - our own digits and operators
        assert value == int(value) and str(int(value)) == t["answer"], t
        assert int(t["answer"]) >= 0, t
        # every operand of the expression is written in the question (constants 4 and 2 of the legs one too)
        for number in re.findall(r"\d+", t["expression"]):
            assert re.search(rf"(?<![\d]){number}(?![\d])", t["question"]), (number, t)
        assert t["question"].rstrip().endswith("?")
    two_step = [t for t in tasks if len(re.findall(r"[-+*/]+", t["expression"])) > 1]
    if difficulty == 1:
        assert not two_step
    else:
        assert 0.3 < len(two_step) / len(tasks) < 0.7  # half of the templates take two steps


def test_every_template_is_reachable_and_difficulty_is_checked():
    seen = set()
    rng = random.Random(0)
    for _ in range(2000):
        seen.add(word_problem(rng, 2)["question"].split()[1])
    assert len(TEMPLATES) == 14 and len(seen) > 5
    with pytest.raises(ValueError, match="difficulty"):
        word_problem(random.Random(0), 0)
    with pytest.raises(ValueError, match="n must be"):
        generate_word_problems(-1)


def test_heldout_set_loads_by_name_and_limit_cuts_it():
    tasks = load_dataset("word_problems")
    assert len(tasks) == WORD_PROBLEMS_HELDOUT
    assert load_dataset("word_problems", limit=7) == tasks[:7]
    assert {"id", "question", "answer", "expression"} <= set(tasks[0])
