"""``rz_agents/VisualClick-v0``: click the named button in a small rendered picture.

The visual counterpart of the OSWorld screenshot env, small enough for a tiny vision-language
model on CPU: each episode shows one picture (``image_size`` square, 64 by default) of a few
labelled coloured buttons (``render.py``) and names one, by colour ("Click the red button.") or
by label ("Click the button labelled 7."). The policy answers ``click(x, y)`` in the picture's
pixels (``pyautogui.click(x, y)`` reads the same); reward 1 when the point is on the named
button, else 0. The observation is one user message whose content is the image part then the
instruction (``rz_agents.images``).

Tasks are ``{"split": "train"|"test", "index": i}`` (or ``{"id": "visual-click/test/12"}``);
without one, the env draws an index of its own ``split`` with the reset's seed, from
``range(num_train_tasks)`` on ``train`` when that is set (a finite training set whose pictures
repeat), else from ``range(2**31)``. ``test`` pictures come from another random stream: held out.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from rz_agents.envs.base import Message, MultiTurnTextEnv
from rz_agents.envs.visual_click.render import (
    ARRANGEMENTS,
    PALETTE,
    Layout,
    check_size,
    make_layout,
    render,
    with_target_color,
)
from rz_agents.envs.visual_click.tasks import check_split, split_index
from rz_agents.images import image_part, text_part

ENV_ID = "rz_agents/VisualClick-v0"
NAME_BY = ("color", "label")
_CLICK = re.compile(r"click\(\s*(?:x\s*=\s*)?(-?\d+(?:\.\d+)?)\s*,\s*(?:y\s*=\s*)?(-?\d+(?:\.\d+)?)\s*\)")

SYSTEM = (
    "You see a {n}x{n} pixel picture of coloured buttons, each labelled with a digit. "
    "Click the button the instruction names: answer with click(x, y), where x counts pixels from the "
    "left edge and y from the top."
)


def instruction(layout: Layout, name_by: str) -> str:
    """The sentence naming the target."""
    b = layout.target_button
    return f"Click the {b.color} button." if name_by == "color" else f"Click the button labelled {b.label}."


def parse_click(text: str) -> tuple[float, float] | None:
    """The last ``click(x, y)`` of a reply (after any reasoning), or None."""
    found = _CLICK.findall(text)
    return (float(found[-1][0]), float(found[-1][1])) if found else None


class VisualClickEnv(MultiTurnTextEnv):
    """Click the named button; reward 1.0 on it, else 0 (see the module docstring)."""

    def __init__(
        self,
        image_size: int = 64,
        n_buttons: int = 3,
        name_by: str = "color",
        split: str = "train",
        num_train_tasks: int | None = None,
        max_turns: int = 1,
        arrangement: str = "random",
        target_color: str | None = None,
        system_prompt: bool = True,
    ) -> None:
        super().__init__(max_turns=max_turns)
        check_size(image_size, n_buttons)
        if arrangement not in ARRANGEMENTS:
            raise ValueError(f"arrangement must be one of {', '.join(ARRANGEMENTS)}, got {arrangement!r}")
        self.arrangement = arrangement
        if target_color is not None and target_color not in PALETTE:
            raise ValueError(f"target_color must be one of {', '.join(PALETTE)} or null: {target_color!r}")
        self.target_color = target_color
        self.system_prompt = bool(system_prompt)  # False: the picture and instruction only (a short prompt)
        if name_by not in NAME_BY:
            raise ValueError(f"name_by must be one of {', '.join(NAME_BY)}, got {name_by!r}")
        check_split(split, num_train_tasks)
        self.image_size, self.n_buttons, self.name_by = image_size, n_buttons, name_by
        self.split, self.num_train_tasks = split, num_train_tasks
        self.layout: Layout | None = None

    def task_of(self, task: dict[str, Any] | None, rng: np.random.Generator) -> tuple[str, int]:
        """``(split, index)`` of a task dict, or drawn with ``rng`` (ValueError naming a bad task)."""
        return split_index(task, rng, "visual-click", self.split, self.num_train_tasks)

    def _reset(self, task: dict[str, Any] | None, rng: np.random.Generator) -> tuple[list[Message], dict]:
        split, index = self.task_of(task, rng)
        self.layout = make_layout(split, index, self.image_size, self.n_buttons, self.arrangement)
        if self.target_color is not None:
            self.layout = with_target_color(self.layout, self.target_color)
        picture = render(self.layout)
        rules = {"role": "system", "content": SYSTEM.format(n=self.image_size)}
        system = [rules] if self.system_prompt else []
        messages = [
            *system,
            {
                "role": "user",
                "content": [image_part(picture), text_part(instruction(self.layout, self.name_by))],
            },
        ]
        info = {
            "task_id": f"visual-click/{split}/{index}",
            "tools": [],
            "target": self.layout.target_button,
            "chance": self.layout.chance,
        }
        return messages, info

    def _step(self, text: str) -> tuple[str, float, bool, dict]:
        assert self.layout is not None
        target = self.layout.target_button
        click = parse_click(text)
        if click is None:
            return "Answer with click(x, y).", 0.0, False, {"error": "no_click", "hit": False}
        hit = target.contains(*click)
        info = {"click": click, "hit": hit}
        if hit:
            return "Hit.", 1.0, True, info
        return f"Missed: ({click[0]:g}, {click[1]:g}) is not on that button.", 0.0, False, info
