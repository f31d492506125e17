"""``rz_agents/ChartRead-v0``: read one bar's value off a rendered bar chart (``chart.py``).

One user message ``[image, "What is the value of the blue bar? Answer with a number."]``; the
reply's last integer is the answer; reward 1 when it is the bar's value, else 0 (a guess scores
``1 / max_value``). Tasks, splits and ``num_train_tasks`` work as in ``VisualClick-v0``
(ids ``chart-read/<split>/<index>``).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from rz_agents.envs.base import Message, MultiTurnTextEnv
from rz_agents.envs.visual_click.chart import Chart, check_chart, make_chart, render_chart
from rz_agents.envs.visual_click.tasks import check_split, split_index
from rz_agents.images import image_part, text_part

ENV_ID = "rz_agents/ChartRead-v0"
_NUMBER = re.compile(r"-?\d+")
SYSTEM = (
    "You see a {n}x{n} pixel bar chart; the ticks on the left mark every unit from 0 to {m}. "
    "Answer the question with one integer."
)


def question(chart: Chart) -> str:
    """The sentence asking for the target bar's value."""
    return f"What is the value of the {chart.bars[chart.target][0]} bar? Answer with a number."


class ChartReadEnv(MultiTurnTextEnv):
    """Read the named bar's value; reward 1.0 when right, else 0."""

    def __init__(
        self,
        image_size: int = 64,
        n_bars: int = 4,
        max_value: int = 9,
        split: str = "train",
        num_train_tasks: int | None = None,
        max_turns: int = 1,
    ) -> None:
        super().__init__(max_turns=max_turns)
        check_chart(image_size, n_bars, max_value)
        check_split(split, num_train_tasks)
        self.image_size, self.n_bars, self.max_value = image_size, n_bars, max_value
        self.split, self.num_train_tasks = split, num_train_tasks
        self.chart: Chart | None = None

    def _task(self, task: dict[str, Any] | None, rng: np.random.Generator) -> tuple[str, int]:
        return split_index(task, rng, "chart-read", self.split, self.num_train_tasks)

    def _reset(self, task: dict[str, Any] | None, rng: np.random.Generator) -> tuple[list[Message], dict]:
        split, index = self._task(task, rng)
        self.chart = make_chart(split, index, self.image_size, self.n_bars, self.max_value)
        messages = [
            {"role": "system", "content": SYSTEM.format(n=self.image_size, m=self.max_value)},
            {
                "role": "user",
                "content": [image_part(render_chart(self.chart)), text_part(question(self.chart))],
            },
        ]
        info = {"task_id": f"chart-read/{split}/{index}", "tools": [], "answer": self.chart.answer}
        return messages, info

    def _step(self, text: str) -> tuple[str, float, bool, dict]:
        assert self.chart is not None
        found = _NUMBER.findall(text)
        if not found:
            return "Answer with one integer.", 0.0, False, {"error": "no_number", "correct": False}
        answer = int(found[-1])
        correct = answer == self.chart.answer
        info = {"answer": answer, "correct": correct}
        return ("Right." if correct else f"{answer} is not that bar's value."), float(correct), correct, info
