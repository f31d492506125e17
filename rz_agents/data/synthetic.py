"""Synthetic integer-arithmetic tasks of tunable difficulty, deterministic given a seed.

Meant for small policies learning to call the Python tool: the question is compact
("Compute 37*48+12.") and the answer is an exact integer.

Difficulty levels:
    1: ``a op b`` with 1-2 digit operands (+, -, *)
    2: ``a*b+c`` style, three 2-digit operands
    3: four 2-3 digit operands, one pair of parentheses
    4+: ``difficulty + 1`` operands of up to ``difficulty`` digits, nested parentheses
"""

from __future__ import annotations

import random

_OPS = ("+", "-", "*")


def _operand(rng: random.Random, digits: int) -> int:
    return rng.randint(2 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def _expression(rng: random.Random, difficulty: int) -> str:
    if difficulty <= 1:
        return f"{_operand(rng, rng.randint(1, 2))}{rng.choice(_OPS)}{_operand(rng, 2)}"
    if difficulty == 2:
        a, b, c = (_operand(rng, 2) for _ in range(3))
        return f"{a}{rng.choice('*+')}{b}{rng.choice(_OPS)}{c}"
    terms = [str(_operand(rng, rng.randint(2, min(difficulty, 6)))) for _ in range(difficulty + 1)]
    ops = [rng.choice(_OPS) for _ in range(len(terms) - 1)]
    # wrap a random run of terms in parentheses (nested ones from level 4 up)
    for _ in range(1 if difficulty == 3 else difficulty - 2):
        i = rng.randrange(len(terms) - 1)
        j = rng.randrange(i + 1, len(terms))
        terms[i] = "(" + terms[i]
        terms[j] = terms[j] + ")"
    return terms[0] + "".join(op + t for op, t in zip(ops, terms[1:], strict=True))


def _evaluate(expr: str) -> int:
    # our own digits/operators/parentheses only; no names, so eval cannot reach anything
    if not set(expr) <= set("0123456789+-*() "):
        raise ValueError(f"unexpected character in generated expression {expr!r}")
    return int(eval(expr, {"__builtins__": {}}, {}))  # noqa: S307


def arithmetic_task(rng: random.Random, difficulty: int = 2, index: int = 0, seed: int = 0) -> dict[str, str]:
    """One task ``{"id", "question", "answer", "expression"}`` drawn with ``rng``."""
    expr = _expression(rng, difficulty)
    return {
        "id": f"arith-d{difficulty}-s{seed}-{index}",
        "question": f"Compute {expr}.",
        "answer": str(_evaluate(expr)),
        "expression": expr,
    }


def generate_arithmetic_tasks(n: int, seed: int = 0, difficulty: int = 2) -> list[dict[str, str]]:
    """``n`` arithmetic tasks; the same ``(n, seed, difficulty)`` always gives the same list."""
    if n < 0 or difficulty < 1:
        raise ValueError(f"n must be >= 0 and difficulty >= 1, got n={n}, difficulty={difficulty}")
    rng = random.Random(f"rz-arith:{seed}:{difficulty}")
    return [arithmetic_task(rng, difficulty, i, seed) for i in range(n)]
