"""Which picture an episode shows: a ``(split, index)`` pair, from a task dict or drawn.

Both rendered-picture envs (VisualClick, ChartRead) name their tasks the same way: ``{"split", "index"}``,
an id ``<name>/<train|test>/<index>``, or nothing (an index drawn from the env's split, the train split
limited to ``num_train_tasks`` when set).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from rz_agents.envs.visual_click.render import SPLITS


def check_split(split: str, num_train_tasks: int | None) -> None:
    """ValueError naming a bad ``split`` or ``num_train_tasks``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if num_train_tasks is not None and (not isinstance(num_train_tasks, int) or num_train_tasks < 1):
        raise ValueError(f"num_train_tasks must be a positive int or null, got {num_train_tasks!r}")


def split_index(
    task: dict[str, Any] | None, rng: np.random.Generator, name: str, split: str, num_train_tasks: int | None
) -> tuple[str, int]:
    """``(split, index)`` of ``task`` (ids of the form ``name/<split>/<index>``), or drawn with ``rng``
    from ``split`` when ``task`` is None; ValueError naming a bad task."""
    if task is None:
        high = num_train_tasks if split == "train" and num_train_tasks else 2**31
        return split, int(rng.integers(high))
    if "id" in task and "index" not in task:
        m = re.match(rf"^{re.escape(name)}/(train|test)/(\d+)$", str(task["id"]))
        if not m:
            raise ValueError(f"task id {task['id']!r} is not of the form {name}/<train|test>/<index>")
        return m.group(1), int(m.group(2))
    split, index = task.get("split", split), task.get("index")
    if split not in SPLITS or not isinstance(index, int) or index < 0:
        raise ValueError(f"a task is {{'split': 'train'|'test', 'index': int >= 0}}, got {task!r}")
    return split, index
