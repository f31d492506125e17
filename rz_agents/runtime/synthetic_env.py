"""A small multi-turn text env for learning tests and throughput benchmarks on tiny random models.

Each turn the env asks for lowercase letters; the turn's reward is the share of the turn's characters
that are lowercase ASCII letters (a random 320-token byte policy scores about 0.1). ``latency_s``
makes each ``step`` take that long in real time (``time.sleep``, like a tool call that waits on a
subprocess), which is what the async rollout loop overlaps with generation and training.
"""

from __future__ import annotations

import string
import time
from typing import Any

import numpy as np

from rz_agents.envs.base import Message, MultiTurnTextEnv

TARGET = frozenset(string.ascii_lowercase)


class LowercaseLettersEnv(MultiTurnTextEnv):
    """Reward per turn: fraction of the reply's characters that are in a-z (0 for an empty reply),
    divided by the number of turns so an episode's return is in [0, 1]."""

    def __init__(self, max_turns: int = 2, latency_s: float = 0.0, min_chars: int = 4) -> None:
        super().__init__(max_turns=max_turns)
        if latency_s < 0:
            raise ValueError(f"latency_s must be >= 0, got {latency_s}")
        self.latency_s = latency_s
        self.min_chars = min_chars

    def _reset(self, task: dict[str, Any] | None, rng: np.random.Generator) -> tuple[list[Message], dict]:
        word = (task or {}).get("word") or "".join(rng.choice(list(string.ascii_lowercase), size=3))
        task_id = str((task or {}).get("id", word))
        return [{"role": "user", "content": f"Write lowercase letters, like {word}."}], {
            "task_id": task_id,
            "tools": [],
        }

    def _step(self, text: str) -> tuple[str, float, bool, dict]:
        if self.latency_s:
            time.sleep(self.latency_s)
        # Short replies are scored against min_chars so that stopping at once is not a way out.
        good = sum(1 for c in text if c in TARGET)
        score = good / max(len(text), self.min_chars)
        return "More lowercase letters.", score / self.max_turns, False, {"letters": good}
