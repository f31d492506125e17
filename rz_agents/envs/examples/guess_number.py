"""Example custom env: guess a hidden integer; the env answers "higher" or "lower".

This is the env walked through in docs/custom_env.md. It shows the whole contract in a few
lines: ``_reset`` builds the prompt from a task (or draws one with the seeded rng), ``_step``
reads the policy's turn, and the base class handles turn limits and truncation.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from rz_agents.envs.base import Message, MultiTurnTextEnv

_GUESS = re.compile(r"-?\d+")


class GuessNumberEnv(MultiTurnTextEnv):
    """Guess a hidden integer in ``[low, high]``; reward 1.0 for a correct guess, else 0."""

    def __init__(self, low: int = 1, high: int = 100, max_turns: int = 8) -> None:
        super().__init__(max_turns=max_turns)
        if low > high:
            raise ValueError(f"low ({low}) must be <= high ({high})")
        self.low, self.high = low, high
        self.secret = low

    def _reset(self, task: dict[str, Any] | None, rng: np.random.Generator) -> tuple[list[Message], dict]:
        if task is not None and "secret" in task:
            self.secret = int(task["secret"])
        else:
            self.secret = int(rng.integers(self.low, self.high + 1))
        prompt = (
            f"I am thinking of an integer between {self.low} and {self.high}. "
            "Reply with one guess per turn; I will say higher or lower."
        )
        task_id = str(task["id"]) if task and "id" in task else f"guess-{self.secret}"
        return [{"role": "user", "content": prompt}], {"task_id": task_id, "tools": []}

    def _step(self, text: str) -> tuple[str, float, bool, dict]:
        found = _GUESS.findall(text)
        if not found:
            return "Please reply with an integer.", 0.0, False, {"error": "no_guess"}
        guess = int(found[-1])  # the last number is the answer, after any reasoning
        if guess == self.secret:
            return "Correct!", 1.0, True, {"guess": guess}
        hint = "higher" if guess < self.secret else "lower"
        return f"{guess} is wrong; go {hint}.", 0.0, False, {"guess": guess}
