"""GSM8K-style word problems from templates: one or two arithmetic steps, exact integer answers.

Sized for small pretrained models learning to use the Python tool: each problem is a short story
whose answer is one arithmetic expression over the numbers in it (kept as the task's
``expression``, which the warm start and tests use). The numbers have two or three digits, so
mental arithmetic by a small model usually fails and translating the story into code pays.

Difficulty: 1 uses only the one-step templates; 2 (default) also the two-step ones.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

NAMES = (
    "Ava", "Ben", "Carla", "Dev", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jonas",
    "Kemi", "Liam", "Mia", "Noah", "Olga", "Priya", "Quinn", "Rosa", "Sam", "Tariq",
)  # fmt: skip
ITEMS = (
    "apples", "stickers", "marbles", "pencils", "cookies", "books", "stamps", "shells",
    "cards", "beads", "eggs", "balloons", "candles", "buttons", "coins", "oranges",
)  # fmt: skip


@dataclass(frozen=True)
class _Template:
    steps: int
    build: Callable[[random.Random, str, str], tuple[str, str]]  # (rng, name, item) -> (question, expr)


def _n(rng: random.Random, lo: int, hi: int) -> int:
    return rng.randint(lo, hi)


def _add(rng, name, item):
    a, b = _n(rng, 20, 480), _n(rng, 20, 480)
    return (
        f"{name} has {a} {item}. Then {name} buys {b} more. How many {item} does {name} have now?",
        f"{a} + {b}",
    )


def _sub(rng, name, item):
    a = _n(rng, 150, 900)
    b = _n(rng, 20, a - 10)
    return (
        f"{name} had {a} {item} and gave {b} of them to a friend. How many {item} does {name} have left?",
        f"{a} - {b}",
    )


def _boxes(rng, name, item):
    a, b = _n(rng, 12, 95), _n(rng, 12, 60)
    return (
        f"There are {a} boxes with {b} {item} in each box. How many {item} are there in total?",
        f"{a} * {b}",
    )


def _share(rng, name, item):
    b, each = _n(rng, 3, 24), _n(rng, 12, 80)
    return (
        f"{name} shares {b * each} {item} equally among {b} friends. How many {item} does each friend get?",
        f"{b * each} // {b}",
    )


def _price(rng, name, item):
    a, b = _n(rng, 12, 95), _n(rng, 11, 60)
    return (
        f"A shop sells {item} for ${a} a bag. {name} buys {b} bags. How many dollars does {name} pay?",
        f"{a} * {b}",
    )


def _pages(rng, name, item):
    a, b = _n(rng, 12, 75), _n(rng, 14, 90)
    return f"{name} reads {a} pages a day for {b} days. How many pages does {name} read in all?", f"{a} * {b}"


def _train(rng, name, item):
    a, b = _n(rng, 45, 180), _n(rng, 3, 14)
    return f"A train travels {a} km every hour. How many km does it travel in {b} hours?", f"{a} * {b}"


def _packs_give(rng, name, item):
    a, b = _n(rng, 6, 40), _n(rng, 6, 30)
    c = _n(rng, 5, a * b - 5)
    return (
        f"{name} buys {a} packs of {item} with {b} {item} in each pack, then gives away {c} {item}. "
        f"How many {item} does {name} have left?",
        f"{a} * {b} - {c}",
    )


def _money_left(rng, name, item):
    b, c = _n(rng, 3, 20), _n(rng, 4, 45)
    a = b * c + _n(rng, 10, 400)
    return (
        f"{name} has ${a}. {name} buys {b} bags of {item} that cost ${c} each. How many dollars does "
        f"{name} have left?",
        f"{a} - {b} * {c}",
    )


def _legs(rng, name, item):
    a, b = _n(rng, 12, 150), _n(rng, 12, 150)
    return (
        f"A farm has {a} cows and {b} chickens. A cow has 4 legs and a chicken has 2 legs. How many legs "
        "do the animals have in total?",
        f"{a} * 4 + {b} * 2",
    )


def _wage(rng, name, item):
    a, b, c = _n(rng, 12, 45), _n(rng, 10, 40), _n(rng, 2, 9)
    return (
        f"{name} earns ${a} per hour and works {b} hours a week. "
        f"How many dollars does {name} earn in {c} weeks?",
        f"{a} * {b} * {c}",
    )


def _school(rng, name, item):
    a, b = _n(rng, 6, 40), _n(rng, 18, 35)
    c = _n(rng, 3, a * b // 4)
    return (
        f"A school has {a} classes with {b} students in each class. {c} students are absent today. "
        "How many students are present?",
        f"{a} * {b} - {c}",
    )


def _three_days(rng, name, item):
    a, b, c = _n(rng, 15, 300), _n(rng, 15, 300), _n(rng, 15, 300)
    return (
        f"{name} collected {a} {item} on Monday, {b} on Tuesday and {c} on Wednesday. How many {item} did "
        f"{name} collect in total?",
        f"{a} + {b} + {c}",
    )


def _lost_found(rng, name, item):
    a = _n(rng, 120, 800)
    b, c = _n(rng, 15, a - 20), _n(rng, 15, 300)
    return (
        f"{name} had {a} {item}, lost {b} of them, and then found {c} more. How many {item} does {name} "
        "have now?",
        f"{a} - {b} + {c}",
    )


TEMPLATES: tuple[_Template, ...] = (
    _Template(1, _add),
    _Template(1, _sub),
    _Template(1, _boxes),
    _Template(1, _share),
    _Template(1, _price),
    _Template(1, _pages),
    _Template(1, _train),
    _Template(2, _packs_give),
    _Template(2, _money_left),
    _Template(2, _legs),
    _Template(2, _wage),
    _Template(2, _school),
    _Template(2, _three_days),
    _Template(2, _lost_found),
)


def _evaluate(expr: str) -> int:
    # our own digits and operators only (no names), so eval cannot reach anything
    if not set(expr) <= set("0123456789+-*/ "):
        raise ValueError(f"unexpected character in generated expression {expr!r}")
    return int(eval(expr, {"__builtins__": {}}, {}))  # noqa: S307


def word_problem(rng: random.Random, difficulty: int = 2, index: int = 0, seed: int = 0) -> dict[str, str]:
    """One task ``{"id", "question", "answer", "expression"}`` drawn with ``rng``."""
    if difficulty < 1:
        raise ValueError(f"difficulty must be >= 1, got {difficulty}")
    pool = [t for t in TEMPLATES if t.steps <= difficulty]
    template = rng.choice(pool)
    question, expr = template.build(rng, rng.choice(NAMES), rng.choice(ITEMS))
    return {
        "id": f"word-d{difficulty}-s{seed}-{index}",
        "question": question,
        "answer": str(_evaluate(expr)),
        "expression": expr,
    }


def generate_word_problems(n: int, seed: int = 0, difficulty: int = 2) -> list[dict[str, str]]:
    """``n`` word problems; the same ``(n, seed, difficulty)`` always gives the same list."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(f"rz-word:{seed}:{difficulty}")
    return [word_problem(rng, difficulty, i, seed) for i in range(n)]
