"""``rz_agents/OSWorld-v0``: an OSWorld desktop as a multi-turn chat env for the rollout loop.

Observations are chat messages: the instruction plus the linearised accessibility tree after
each action (and any action error). Actions are the policy's reply text, parsed as ``pyautogui``
code blocks or ``computer_13`` JSON, with ``WAIT``/``DONE``/``FAIL``. The reward is
``DesktopEnv.evaluate()``, given when the agent says ``DONE``/``FAIL`` or the turn limit ends the
episode; every other step gives 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rz_agents.envs.base import Message, MultiTurnTextEnv
from rz_agents.envs.osworld.a11y import linearize
from rz_agents.envs.osworld.actions import ActionParseError, parse_action
from rz_agents.envs.osworld.desktop_env import DesktopEnv
from rz_agents.envs.osworld.task import Task, load_tasks

ENV_ID = "rz_agents/OSWorld-v0"

SYSTEM_PYAUTOGUI = """You control a Linux desktop ({w}x{h} pixels) to complete the user's task.
Each turn you get the screen's accessibility tree (one element per line: tag, name, text, \
top-left position, size). Reply with ONE ```python``` code block using pyautogui (already \
imported), e.g. ```python
pyautogui.click(120, 340)
pyautogui.typewrite('hello')
```
Positions are screen pixels; click an element's centre (position + size/2).
Reply WAIT to wait, DONE when the task is complete, FAIL if it cannot be done."""

SYSTEM_COMPUTER13 = """You control a Linux desktop ({w}x{h} pixels) to complete the user's task.
Each turn you get the screen's accessibility tree. Reply with ONE JSON action such as \
{{"action_type": "CLICK", "parameters": {{"x": 120, "y": 340}}}}; action types: MOVE_TO, CLICK, \
MOUSE_DOWN, MOUSE_UP, RIGHT_CLICK, DOUBLE_CLICK, DRAG_TO, SCROLL, TYPING, PRESS, KEY_DOWN, KEY_UP, \
HOTKEY. Reply WAIT to wait, DONE when the task is complete, FAIL if it cannot be done."""


def register_envs() -> None:
    """Register ``rz_agents/OSWorld-v0`` with Gymnasium (idempotent)."""
    from rz_agents.envs.registry import register_env

    register_env(ENV_ID, "rz_agents.envs.osworld.gym_env:OSWorldEnv")


class OSWorldEnv(MultiTurnTextEnv):
    """OSWorld tasks as a Gymnasium multi-turn text env.

    ``reset(options={"task": task_json})`` runs that task; without a task one is drawn (with the
    reset's seed) from ``tasks_path``. ``info["evaluation"]`` on the last step holds the score's
    details; ``info["action_error"]`` is set when a reply held no valid action.
    """

    def __init__(
        self,
        max_turns: int = 15,
        action_space: str = "pyautogui",
        tasks_path: str | None = None,
        provider: str = "local",
        provider_options: dict[str, Any] | None = None,
        download_cache: str | None = None,
        max_tree_chars: int = 20000,
        pause: float = 0.5,
    ) -> None:
        super().__init__(max_turns=max_turns)
        self.action_space_name = action_space
        self.max_tree_chars = max_tree_chars
        self.pause = pause
        self.tasks: list[Task] = (
            [t for _p, t in load_tasks(tasks_path) if isinstance(t, Task)] if tasks_path else []
        )
        self.desktop = DesktopEnv(
            provider_name=provider,
            action_space=action_space,
            require_screenshot=False,  # a text env: the tree is the observation
            download_cache=download_cache,
            provider_options=provider_options,
        )
        self.screen_size = getattr(self.desktop.provider, "screen_size", (1920, 1080))

    def _observation_text(self, obs: dict[str, Any]) -> str:
        return "Accessibility tree:\n" + linearize(obs.get("accessibility_tree"), self.max_tree_chars)

    def _reset(self, task: dict[str, Any] | None, rng: np.random.Generator) -> tuple[list[Message], dict]:
        if task is None:
            if not self.tasks:
                raise ValueError("no task given: pass options={'task': {...}} or tasks_path=")
            task_obj: Task | dict[str, Any] = self.tasks[int(rng.integers(len(self.tasks)))]
        else:
            task_obj = task
        obs = self.desktop.reset(task_obj)
        assert self.desktop.task is not None
        template = SYSTEM_PYAUTOGUI if self.action_space_name == "pyautogui" else SYSTEM_COMPUTER13
        w, h = self.screen_size
        messages = [
            {"role": "system", "content": template.format(w=w, h=h)},
            {"role": "user", "content": f"Task: {obs['instruction']}\n\n{self._observation_text(obs)}"},
        ]
        return messages, {"task_id": self.desktop.task.id, "timings": dict(self.desktop.timings)}

    def _step(self, text: str) -> tuple[str, float, bool, dict]:
        try:
            actions = parse_action(text, self.action_space_name)
        except ActionParseError as exc:
            return f"Action error: {exc}", 0.0, False, {"action_error": str(exc)}
        obs: dict[str, Any] = {}
        errors = []
        for action in actions:
            obs, _r, done, info = self.desktop.step(action, pause=self.pause)
            if info.get("error"):
                errors.append(info["error"])
            if done:
                score = self.desktop.evaluate()
                return "Episode finished.", score, True, self._final_info()
        content = self._observation_text(obs)
        if errors:
            content = "Your code raised an error:\n" + "\n".join(errors) + "\n\n" + content
        return content, 0.0, False, {"errors": errors}

    def _final_info(self) -> dict[str, Any]:
        ev = self.desktop.last_evaluation
        return {
            "evaluation": {"score": ev.score, "metric_scores": ev.metric_scores, "errors": ev.errors}
            if ev
            else None,
            "timings": dict(self.desktop.timings),
        }

    def _on_truncate(self) -> float:
        # Out of turns: the desktop's state is scored as it stands, as in OSWorld's max_steps.
        return self.desktop.evaluate()

    def close(self) -> None:
        """Stop the desktop and all its processes."""
        super().close()
        self.desktop.close()
