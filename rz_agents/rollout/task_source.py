"""A reproducible, resumable stream of tasks: a list cycled in a seeded order, one shuffle per epoch."""

from __future__ import annotations

import random
from typing import Any


class TaskSource:
    """Yields tasks forever; ``position`` (how many were taken) is all the state a resume needs.

    With ``tasks=None`` it yields None, and the env draws its own task from the episode seed.
    """

    def __init__(self, tasks: list[dict[str, Any]] | None, seed: int = 0, shuffle: bool = True) -> None:
        if tasks is not None and not tasks:
            raise ValueError("tasks must be None or a non-empty list")
        self.tasks = tasks
        self.seed = seed
        self.shuffle = shuffle
        self.position = 0

    def _order(self, epoch: int) -> list[int]:
        idx = list(range(len(self.tasks or [])))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(idx)
        return idx

    def next(self) -> dict[str, Any] | None:
        """The next task (None when the env draws tasks itself)."""
        pos = self.position
        self.position += 1
        if self.tasks is None:
            return None
        epoch, i = divmod(pos, len(self.tasks))
        return self.tasks[self._order(epoch)[i]]

    def state_dict(self) -> dict[str, int]:
        """What a checkpoint stores."""
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a stored position."""
        self.position = int(state["position"])
