"""``rz_agents/OSWorld-v0``: an OSWorld desktop as a multi-turn chat env for the rollout loop.

Observations are chat messages in the form of OSWorld's accessibility-tree text agent
(``prompts.py``): a system message with the action rules and the task, then each turn a user
message with the linearised tree, filtered and cut to ``max_tree_tokens`` (and the previous
action's error, if any). Actions are the policy's reply text, parsed as ``pyautogui`` code blocks
or ``computer_13`` JSON, with ``WAIT``/``DONE``/``FAIL``. The reward is ``DesktopEnv.evaluate()``,
given when the agent says ``DONE``/``FAIL`` or the turn limit ends the episode; every other step
gives 0. The env keeps the whole chat (a trajectory's tokens only grow); policies that see a
window of it (``prompts.window_messages``) trim on their side.

``observation`` picks what the agent sees, with OSWorld's names: ``a11y_tree`` (the default, the
text above), ``screenshot`` or ``screenshot_a11y_tree``. With a screenshot, each observation
message's content is a list of parts, the text then ``{"type": "image", "image": PIL.Image}``
(``rz_agents.images``), the screen resized to ``image_size``; the agent's coordinates are in
the image's pixels and are scaled to the screen's before its code runs (``screen_scale.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rz_agents.envs.base import Message, MultiTurnTextEnv
from rz_agents.envs.osworld.a11y import linearize, trim
from rz_agents.envs.osworld.actions import Action, ActionParseError, parse_action
from rz_agents.envs.osworld.desktop_env import DesktopEnv
from rz_agents.envs.osworld.prompts import OBSERVATION_TYPES, observation_prompt, system_prompt
from rz_agents.envs.osworld.screen_scale import (
    ScreenScale,
    check_image_size,
    resize_screenshot,
    scale_pyautogui_code,
    scale_tree_table,
)
from rz_agents.envs.osworld.task import LOCAL_TASKS, Task, load_tasks
from rz_agents.images import image_part, text_part

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

    ``observation``: ``a11y_tree`` | ``screenshot`` | ``screenshot_a11y_tree`` (OSWorld's ``som`` is
    not offered). ``image_size``: ``[width, height]`` the screenshot is resized to (the model's image
    size; None keeps the screen's); only with a screenshot observation. ``info["screen_scale"]``
    (reset) gives both sizes and the factors from image to screen pixels.
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
        observation: str = "a11y_tree",
        image_size: list[int] | tuple[int, int] | None = None,
    ) -> None:
        super().__init__(max_turns=max_turns)
        if observation not in OBSERVATION_TYPES:
            hint = " (set-of-marks is not offered)" if observation == "som" else ""
            raise ValueError(
                f"observation must be one of {', '.join(OBSERVATION_TYPES)}, got {observation!r}{hint}"
            )
        self.observation = observation
        self.screenshots = observation != "a11y_tree"
        if image_size is not None and not self.screenshots:
            raise ValueError(
                f"image_size={image_size!r} needs a screenshot observation (observation={observation!r})"
            )
        self.image_size = check_image_size(image_size)
        self.action_space_name = action_space
        self.max_tree_tokens = max_tree_tokens
        self.pause = pause
        if tasks_path == "local":
            tasks_path = LOCAL_TASKS
        self.tasks: list[Task] = (
            [t for _p, t in load_tasks(tasks_path) if isinstance(t, Task)] if tasks_path else []
        )
        self._by_id = {t.id: t for t in self.tasks}
        self.desktop = DesktopEnv(
            provider_name=provider,
            action_space=action_space,
            require_screenshot=self.screenshots,
            require_a11y_tree=observation != "screenshot",
            a11y_view="agent",  # only what the table reads: a fraction of the tree's CPU
            download_cache=download_cache,
            provider_options=provider_options,
        )
        self.screen_size = getattr(self.desktop.provider, "screen_size", (1920, 1080))
        w, h = self.screen_size
        self.scale = ScreenScale(w, h, *(self.image_size or (w, h)))  # updated by each screenshot

    def _observation(self, obs: dict[str, Any], errors: list[str] | None = None) -> str | list[dict]:
        """The user message's content: the prompt text, then the screenshot when the agent sees one."""
        tree = None
        if self.screenshots:
            image, self.scale = resize_screenshot(obs["screenshot"], self.image_size)
        if self.observation != "screenshot":
            tree = trim(linearize(obs.get("accessibility_tree")), self.max_tree_tokens)
            tree = scale_tree_table(tree, self.scale) if self.screenshots else tree
        text = observation_prompt(tree, errors, self.observation)
        return [text_part(text), image_part(image)] if self.screenshots else text

    def _to_screen(self, action: Action) -> Action:
        """The action with its coordinates in screen pixels (the agent gave them in image pixels)."""
        if action.kind != "code" or self.scale.identity:
            return action
        return Action("code", scale_pyautogui_code(action.code, self.scale))

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
        user = self._observation(obs)  # first: a screenshot sets the scale the prompt states
        size = (self.scale.image_w, self.scale.image_h) if self.screenshots else self.screen_size
        messages = [
            {
                "role": "system",
                "content": system_prompt(self.action_space_name, obs["instruction"], size, self.observation),
            },
            {"role": "user", "content": user},
        ]
        info = {"task_id": self.desktop.task.id, "timings": dict(self.desktop.timings)}
        if self.screenshots:
            info["screen_scale"] = self.scale.as_dict()
        return messages, info

    def _step(self, text: str) -> tuple[str | list[Message], float, bool, dict]:
        try:
            actions = parse_action(text, self.action_space_name)
        except ActionParseError as exc:
            if not self.screenshots:
                return f"Action error: {exc}", 0.0, False, {"action_error": str(exc)}
            # A screenshot agent sees the screen every turn, as OSWorld's agent is prompted each turn with the
            # latest screenshot whether or not its reply held an action: the error, then the screen.
            content = self._observation(self.desktop.observe(), [f"Action error: {exc}"])
            return [{"role": "user", "content": content}], 0.0, False, {"action_error": str(exc)}
        obs: dict[str, Any] = {}
        errors = []
        for i, action in enumerate(actions):
            # only the reply's last action is observed: the agent reads no tree in between
            obs, _r, done, info = self.desktop.step(
                self._to_screen(action), pause=self.pause, observe=i == len(actions) - 1
            )
            if info.get("error"):
                errors.append(info["error"])
            if done:
                score = self.desktop.evaluate()
                return "Episode finished.", score, True, self._final_info()
        return [{"role": "user", "content": self._observation(obs, errors)}], 0.0, False, {"errors": errors}

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
