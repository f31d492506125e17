"""Tasks from reasoning-gym's procedural generators, as ``{"id", "question", "answer"}`` dicts.

Optional: reasoning-gym is imported only when this is called (its import takes seconds). Only
tasks whose answer is checked by string/math equality fit our 0/1 math reward; generators with a
custom scorer (e.g. puzzles with many valid answers) need their own reward.
"""

from __future__ import annotations

from typing import Any


def reasoning_gym_tasks(name: str, n: int, seed: int = 0, **config: Any) -> list[dict[str, str]]:
    """``n`` tasks of reasoning-gym's ``name`` generator (deterministic given ``seed``).

    ``config`` goes to the generator (e.g. ``min_terms=2`` for ``basic_arithmetic``).
    """
    try:
        import reasoning_gym
    except ImportError:
        raise ImportError("reasoning_gym_tasks needs reasoning-gym: pip install reasoning-gym") from None
    try:
        dataset = reasoning_gym.create_dataset(name, size=n, seed=seed, **config)
    except (KeyError, ValueError, TypeError) as exc:
        raise ValueError(f"reasoning-gym cannot build {name!r} with {config}: {exc}") from None
    return [
        {"id": f"rg-{name}-s{seed}-{i}", "question": str(item["question"]), "answer": str(item["answer"])}
        for i, item in enumerate(dataset)
    ]
