"""Gymnasium ids of the rz_agents envs, registered on ``import rz_agents.envs``.

Entry points are strings so registering costs nothing: an env's module (and its dependencies,
e.g. a browser for OSWorld) is imported only when ``gymnasium.make`` builds it.
"""

from __future__ import annotations

from typing import Any

import gymnasium

BUILTIN_ENVS: dict[str, str] = {
    "rz_agents/PythonTool-v0": "rz_agents.envs.python_tool.env:PythonToolEnv",
    "rz_agents/WordProblemTool-v0": "rz_agents.envs.word_problem_tool:WordProblemToolEnv",
    "rz_agents/GuessNumber-v0": "rz_agents.envs.examples.guess_number:GuessNumberEnv",
    "rz_agents/OSWorld-v0": "rz_agents.envs.osworld.gym_env:OSWorldEnv",
}


def register_env(env_id: str, entry_point: str | Any, **kwargs: Any) -> None:
    """Register ``env_id`` with Gymnasium; registering the same id twice is a no-op.

    ``entry_point`` is ``"package.module:ClassName"`` or a callable; ``kwargs`` become the
    default constructor arguments (``gymnasium.make(env_id, **overrides)`` can change them).
    """
    if env_id in gymnasium.registry:
        return
    gymnasium.register(id=env_id, entry_point=entry_point, kwargs=kwargs or {})


def register_builtin_envs() -> None:
    """Register every env shipped with rz_agents."""
    for env_id, entry_point in BUILTIN_ENVS.items():
        register_env(env_id, entry_point)
