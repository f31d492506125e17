"""``WordProblemToolEnv``: GSM8K-style word problems solved with the sandboxed Python tool.

The episode mechanics are ``PythonToolEnv``'s (a real sandboxed interpreter, Qwen3/Hermes tool
calls, ``\\boxed{}`` answers, math-verify rewards). Tasks come from the template generator in
``rz_agents.data.word_problems`` (drawn from the episode seed), or from ``tasks`` (a list or a
packaged dataset name such as ``gsm8k``). The prompt is compact: the user message is the question
alone and the tool schema is not written into it; the policy knows its one tool from its warm
start, which keeps a small model's episodes short.
"""

from __future__ import annotations

from typing import Any

from rz_agents.data.word_problems import word_problem
from rz_agents.envs.python_tool import PythonToolEnv


class WordProblemToolEnv(PythonToolEnv):
    """PythonToolEnv on generated word problems, compact prompt, tools known from training."""

    generate_task = staticmethod(word_problem)

    def __init__(self, difficulty: int = 2, max_turns: int = 3, **kwargs: Any) -> None:
        kwargs.setdefault("prompt_style", "compact")
        kwargs.setdefault("system_prompt", None)
        kwargs.setdefault("advertise_tools", kwargs["prompt_style"] != "compact")
        super().__init__(max_turns=max_turns, difficulty=difficulty, **kwargs)
