"""Gymnasium ids of the rz_agents envs, registered on ``import rz_agents``; registering a user's env.

Entry points are strings so registering costs nothing: an env's module (and its dependencies,
e.g. a browser for OSWorld) is imported only when ``gymnasium.make`` builds it. How a config's
``env.id`` is turned into something to build (plugins, ``module:env-id``, ``module:Class``) is
``rz_agents.envs.resolve``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import gymnasium

log = logging.getLogger(__name__)

BUILTIN_ENVS: dict[str, str] = {
    "rz_agents/PythonTool-v0": "rz_agents.envs.python_tool.env:PythonToolEnv",
    "rz_agents/WordProblemTool-v0": "rz_agents.envs.word_problem_tool:WordProblemToolEnv",
    "rz_agents/GuessNumber-v0": "rz_agents.envs.examples.guess_number:GuessNumberEnv",
    "rz_agents/OSWorld-v0": "rz_agents.envs.osworld.gym_env:OSWorldEnv",
    "rz_agents/VisualClick-v0": "rz_agents.envs.visual_click.env:VisualClickEnv",
    "rz_agents/ChartRead-v0": "rz_agents.envs.visual_click.chart_env:ChartReadEnv",
    "rz_agents/ShellTask-v0": "rz_agents.envs.harbor.env:ShellTaskEnv",
}


def register_env(
    env_id: str,
    entry_point: str | Any,
    *,
    max_episode_steps: int | None = None,
    additional_wrappers: Sequence[Any] = (),
    **kwargs: Any,
) -> None:
    """Register ``env_id`` with Gymnasium.

    ``entry_point`` is ``"package.module:ClassName"`` or a callable; ``kwargs`` become the
    default constructor arguments (``gymnasium.make(env_id, **overrides)`` and a run's ``env.kwargs``
    can change them). ``max_episode_steps`` and ``additional_wrappers`` (``WrapperSpec``s) are
    Gymnasium's own and are kept when ``rz train`` builds the env. Registering the same id again with
    the same arguments is a no-op (a module imported twice); with other arguments it warns and the new
    registration replaces the old one, as in Gymnasium.
    """
    new = {
        "entry_point": entry_point,
        "kwargs": dict(kwargs),
        "max_episode_steps": max_episode_steps,
        "additional_wrappers": tuple(additional_wrappers),
    }
    old = gymnasium.registry.get(env_id)
    if old is not None:
        before = {
            "entry_point": old.entry_point,
            "kwargs": dict(old.kwargs or {}),
            "max_episode_steps": old.max_episode_steps,
            "additional_wrappers": tuple(old.additional_wrappers),
        }
        if before == new:
            return
        changed = ", ".join(f"{k}: {before[k]!r} -> {new[k]!r}" for k in new if before[k] != new[k])
        log.warning("register_env(%r): replacing its earlier registration (%s)", env_id, changed)
        del gymnasium.registry[env_id]  # so that Gymnasium's own "overriding" warning does not repeat ours
    gymnasium.register(id=env_id, **new)


def register_builtin_envs() -> None:
    """Register every env shipped with rz_agents."""
    for env_id, entry_point in BUILTIN_ENVS.items():
        register_env(env_id, entry_point)


def check_env_id(env_id: str) -> None:
    """Raise ValueError with a did-you-mean when ``env_id`` names nothing that can be built."""
    from rz_agents.envs.resolve import resolve_env

    resolve_env(env_id)
