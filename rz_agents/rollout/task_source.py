"""A reproducible, resumable stream of tasks: a list cycled in a seeded order, one shuffle per epoch."""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any


class TaskListChanged(ValueError):
    """A checkpoint's task position was taken in another task list than the one the run now has."""


def fingerprint(tasks: list[dict[str, Any]] | None) -> str | None:
    """A short hash of the task list's content and order (None when the env draws its own tasks)."""
    if tasks is None:
        return None
    text = json.dumps(tasks, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


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
        self.fingerprint = fingerprint(tasks)

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

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint stores: the position, and which task list it counts in (its size and
        fingerprint; absent when the env draws its own tasks)."""
        state: dict[str, Any] = {"position": self.position}
        if self.tasks is not None:
            state.update(task_count=len(self.tasks), fingerprint=self.fingerprint)
        return state

    def check_state(self, state: dict[str, Any]) -> None:
        """Raise TaskListChanged if ``state`` counted its position in another task list (a task file edited
        between a run and its resume would pose different tasks at the same positions, silently)."""
        saved = state.get("fingerprint")
        if saved is None or saved == self.fingerprint:  # older checkpoints did not record one
            return
        now = "no task list (the env draws its own)" if self.tasks is None else (
            f"{len(self.tasks)} tasks (fingerprint {self.fingerprint})"
        )  # fmt: skip
        raise TaskListChanged(
            f"env.tasks changed since the checkpoint: it was made with {state.get('task_count')} tasks "
            f"(fingerprint {saved}), env.tasks now has {now}; resuming would pose other tasks at the same "
            "positions: restore the original task list or start a new run"
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a stored position (``check_state`` first)."""
        self.check_state(state)
        self.position = int(state["position"])
