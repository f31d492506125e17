"""The task bench/vs_trl.py trains on, the same on both sides: one-turn, plain-text word problems.

``rz_agents.data.word_problems`` at difficulty 1 (one-step a+b, a-b, a*b, a//b stories), asked as one user
message; the reply's last ``\\boxed{}`` answer scores 1 when it equals the gold answer (``math_reward``, the
reward the packaged word-problem recipes use), else 0. No tool: TRL's GRPO trainer and rz's engine then do the
same work per episode (one prompt, one completion of at most the same number of tokens).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from rz_agents.data.word_problems import generate_word_problems, word_problem
from rz_agents.envs.base import Message, MultiTurnTextEnv
from rz_agents.rewards.math_reward import math_reward

DIFFICULTY = 1
INSTRUCTION = "Solve the problem. End your reply with the answer in \\boxed{}."


def prompt_of(question: str) -> str:
    """The user message of a problem (both sides)."""
    return f"{question}\n{INSTRUCTION}"


def problems(n: int, seed: int) -> list[dict[str, str]]:
    """``n`` problems from the generator (TRL's dataset; rz's env draws from the same generator)."""
    return generate_word_problems(n, seed=seed, difficulty=DIFFICULTY)


def reward(completion: str, gold: str) -> float:
    """1.0 when the completion's last boxed answer equals ``gold``, else 0.0."""
    return math_reward(completion, gold)


class WordProblemTextEnv(MultiTurnTextEnv):
    """One turn: the problem in, the reply scored by ``reward``."""

    def __init__(self, max_turns: int = 1) -> None:
        super().__init__(max_turns=max_turns)
        self.answer = ""

    def _reset(self, task: dict[str, Any] | None, rng: np.random.Generator) -> tuple[list[Message], dict]:
        problem = task or word_problem(random.Random(int(rng.integers(2**31))), DIFFICULTY)
        self.answer = str(problem["answer"])
        return [{"role": "user", "content": prompt_of(problem["question"])}], {
            "task_id": problem.get("id", "word"),
            "tools": [],
        }

    def _step(self, text: str) -> tuple[str, float, bool, dict]:
        return "", reward(text, self.answer), True, {}
