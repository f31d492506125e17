"""Gymnasium ids of the rz_agents envs, registered on ``import rz_agents``; checking an env id before a run.

Entry points are strings so registering costs nothing: an env's module (and its dependencies,
e.g. a browser for OSWorld) is imported only when ``gymnasium.make`` builds it.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import pkgutil
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


def is_class_path(env_id: str) -> bool:
    """True for ``package.module:Class`` (imported as is), False for a Gymnasium id (``gymnasium.make``)."""
    return ":" in env_id and "/" not in env_id


def _did_you_mean(word: str, choices: list[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def check_env_id(env_id: str) -> None:
    """Raise ValueError with a did-you-mean when ``env_id`` names nothing that can be built.

    A Gymnasium id must be registered; for ``package.module:Class`` the module must import and hold the
    class (its module is imported; a Gymnasium id imports nothing).
    """
    if not env_id:
        raise ValueError("env.id is empty")
    if not is_class_path(env_id):
        if env_id not in gymnasium.registry:
            hint = _did_you_mean(env_id, list(gymnasium.registry))
            raise ValueError(f"env.id: no Gymnasium env {env_id!r} is registered{hint}")
        return
    module_name, _, name = env_id.partition(":")
    try:
        found = importlib.util.find_spec(module_name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        found = False
    if not found:
        parent, _, leaf = module_name.rpartition(".")
        siblings: list[str] = []
        if parent:
            try:
                siblings = [m.name for m in pkgutil.iter_modules(importlib.import_module(parent).__path__)]
            except (ImportError, AttributeError):
                siblings = []
        hint = _did_you_mean(leaf, siblings, prefix=f"{parent}.")
        raise ValueError(f"env.id {env_id!r}: no module named {module_name!r}{hint}")
    module = importlib.import_module(module_name)
    if not hasattr(module, name):
        classes = [k for k, v in vars(module).items() if isinstance(v, type)]
        raise ValueError(f"env.id {env_id!r}: {module_name} has no {name!r}{_did_you_mean(name, classes)}")
