"""OSWorld on this machine: task loader, runnability check, DesktopEnv API and a Gymnasium env.

Heavy parts (Playwright, X11) load only when a desktop starts. ``register_envs()`` registers
``rz_agents/OSWorld-v0``.
"""

from __future__ import annotations

from rz_agents.envs.osworld.task import LOCAL_TASKS, Task, TaskFormatError, load_task, load_tasks, parse_task


def register_envs() -> None:
    """Register ``rz_agents/OSWorld-v0`` with Gymnasium (idempotent)."""
    from rz_agents.envs.osworld.gym_env import register_envs as _register

    _register()


__all__ = ["LOCAL_TASKS", "Task", "TaskFormatError", "load_task", "load_tasks", "parse_task", "register_envs"]
