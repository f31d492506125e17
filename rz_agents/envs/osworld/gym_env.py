"""``rz_agents/OSWorld-v0``: an OSWorld desktop as a multi-turn chat env for the rollout loop.

Observations are chat messages in the form of OSWorld's accessibility-tree text agent
(``prompts.py``): a system message with the action rules and the task, then each turn a user
message with the linearised tree, filtered and cut to ``max_tree_tokens`` (and the previous
action's error, if any). Actions are the policy's reply text, parsed as ``pyautogui`` code blocks
or ``computer_13`` JSON, with ``WAIT``/``DONE``/``FAIL``. The reward is ``DesktopEnv.evaluate()``,
given when the agent says ``DONE``/``FAIL`` or the turn limit ends the episode; every other step
gives 0. The env keeps the whole chat (a trajectory's tokens only grow); policies that see a
window of it (``prompts.window_messages``) trim on their side.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rz_agents.envs.base import Message, MultiTurnTextEnv
from rz_agents.envs.osworld.a11y import linearize, trim
from rz_agents.envs.osworld.actions import ActionParseError, parse_action
from rz_agents.envs.osworld.desktop_env import DesktopEnv
from rz_agents.envs.osworld.prompts import observation_prompt, system_prompt
from rz_agents.envs.osworld.task import Task, load_tasks

ENV_ID = "rz_agents/OSWorld-v0"


def register_envs() -> None:
    """Register ``rz_agents/OSWorld-v0`` with Gymnasium (idempotent)."""
    from rz_agents.envs.registry import register_env

    register_env(ENV_ID, "rz_agents.envs.osworld.gym_env:OSWorldEnv")


class OSWorldEnv(MultiTurnTextEnv):
    """OSWorld tasks as a Gymnasium multi-turn text env.

    ``reset(options={"task": task_json})`` runs that task; a task given as ``{"id": ...}`` alone
    (what a training config lists in ``env.tasks``) is looked up in ``tasks_path``; without a task
    one is drawn (with the reset's seed) from ``tasks_path`` (``"local"``: the packaged task set).
    ``info["evaluation"]`` on the last step holds the score's details; ``info["action_error"]`` is
    set when a reply held no valid action. One env holds one desktop at a time, so the number of
    env instances (the rollout's concurrent episodes) bounds the desktops running at once.
    """

    def __init__(
        self,
        max_turns: int = 15,
        action_space: str = "pyautogui",
        tasks_path: str | None = None,
        provider: str = "local",
        provider_options: dict[str, Any] | None = None,
        download_cache: str | None = None,
        max_tree_tokens: int = 10000,
        pause: float = 0.5,
    ) -> None:
        super().__init__(max_turns=max_turns)
        self.action_space_name = action_space
        self.max_tree_tokens = max_tree_tokens
        self.pause = pause
        if tasks_path == "local":
            from rz_agents.envs.osworld import LOCAL_TASKS

            tasks_path = LOCAL_TASKS
        self.tasks: list[Task] = (
            [t for _p, t in load_tasks(tasks_path) if isinstance(t, Task)] if tasks_path else []
        )
        self._by_id = {t.id: t for t in self.tasks}
        self.desktop = DesktopEnv(
            provider_name=provider,
            action_space=action_space,
            require_screenshot=False,  # a text env: the tree is the observation
            a11y_view="agent",  # only what the table reads: a fraction of the tree's CPU
            download_cache=download_cache,
            provider_options=provider_options,
        )
        self.screen_size = getattr(self.desktop.provider, "screen_size", (1920, 1080))

    def _observation_text(self, obs: dict[str, Any], errors: list[str] | None = None) -> str:
        tree = trim(linearize(obs.get("accessibility_tree")), self.max_tree_tokens)
        return observation_prompt(tree, errors)

    def _reset(self, task: dict[str, Any] | None, rng: np.random.Generator) -> tuple[list[Message], dict]:
        if task is None:
            if not self.tasks:
                raise ValueError("no task given: pass options={'task': {...}} or tasks_path=")
            task_obj: Task | dict[str, Any] = self.tasks[int(rng.integers(len(self.tasks)))]
        elif set(task) <= {"id", "domain"}:  # a reference into tasks_path
            if task.get("id") not in self._by_id:
                raise ValueError(
                    f"task {task.get('id')!r} is not in tasks_path ({len(self.tasks)} tasks loaded)"
                )
            task_obj = self._by_id[task["id"]]
        else:
            task_obj = task
        obs = self.desktop.reset(task_obj)
        assert self.desktop.task is not None
        messages = [
            {
                "role": "system",
                "content": system_prompt(self.action_space_name, obs["instruction"], self.screen_size),
            },
            {"role": "user", "content": self._observation_text(obs)},
        ]
        return messages, {"task_id": self.desktop.task.id, "timings": dict(self.desktop.timings)}

    def _step(self, text: str) -> tuple[str, float, bool, dict]:
        try:
            actions = parse_action(text, self.action_space_name)
        except ActionParseError as exc:
            return f"Action error: {exc}", 0.0, False, {"action_error": str(exc)}
        obs: dict[str, Any] = {}
        errors = []
        for i, action in enumerate(actions):
            # only the reply's last action is observed: the agent reads no tree in between
            obs, _r, done, info = self.desktop.step(action, pause=self.pause, observe=i == len(actions) - 1)
            if info.get("error"):
                errors.append(info["error"])
            if done:
                score = self.desktop.evaluate()
                return "Episode finished.", score, True, self._final_info()
        return self._observation_text(obs, errors), 0.0, False, {"errors": errors}

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
