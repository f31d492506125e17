"""Policies for ``rz osworld eval``: scripted oracles, a no-op, or any ``module:callable``.

A policy is ``policy(messages, task) -> reply``: it sees the chat so far (system, user,
assistant, ... messages) and the task JSON, and returns its next reply text.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

Policy = Callable[[list[dict[str, str]], dict[str, Any]], str]


class OraclePolicy:
    """Replays the scripted replies in ``oracles/<task_id>.json`` next to the tasks."""

    def __init__(self, oracle_dir: str | Path) -> None:
        self.oracle_dir = Path(oracle_dir)

    def replies(self, task_id: str) -> list[str]:
        """The scripted replies for a task; ``KeyError`` when the task has no oracle."""
        path = self.oracle_dir / f"{task_id}.json"
        if not path.is_file():
            raise KeyError(f"no oracle trajectory for task {task_id} (looked for {path})")
        return list(json.loads(path.read_text())["replies"])

    def __call__(self, messages: list[dict[str, str]], task: dict[str, Any]) -> str:
        replies = self.replies(task["id"])
        turn = sum(m["role"] == "assistant" for m in messages)
        return replies[turn] if turn < len(replies) else "DONE"


def noop_policy(messages: list[dict[str, str]], task: dict[str, Any]) -> str:
    """Declares the task done at once: the empty trajectory (scores 0 unless already solved)."""
    return "DONE"


def find_oracle_dir(tasks_path: str | Path) -> Path:
    """The ``oracles`` folder of a task set (next to the tasks, or one level up for a single file)."""
    p = Path(tasks_path)
    for base in ([p] if p.is_dir() else []) + [p.parent, p.parent.parent]:
        if (base / "oracles").is_dir():
            return base / "oracles"
    raise FileNotFoundError(f"no oracles/ folder found for {tasks_path}")


def load_policy(spec: str | Policy, tasks_path: str | Path) -> Policy:
    """``"oracle"``, ``"noop"``, ``"package.module:callable"`` or a callable -> a policy."""
    if callable(spec):
        return spec
    if spec == "oracle":
        return OraclePolicy(find_oracle_dir(tasks_path))
    if spec == "noop":
        return noop_policy
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"policy must be 'oracle', 'noop' or 'module:callable', got {spec!r}")
    fn = getattr(importlib.import_module(module_name), attr, None)
    if not callable(fn):
        raise ValueError(f"{spec}: {attr!r} is not a callable in {module_name}")
    return fn
