"""``ArithmeticToolEnv``: the CPU demo's task — compact arithmetic prompts, answered with the Python tool.

The same episode mechanics as ``PythonToolEnv`` (a real sandboxed interpreter, Qwen3/Hermes tool
calls, ``\\boxed{}`` answers, math-verify rewards) with a compact prompt: the user message is just
"Compute 37*48+12." and the tool list is not written into the prompt. A tiny policy learns the call
format from its warm-start demonstrations instead of reading a JSON tool schema, which keeps every
episode a few hundred byte tokens long (prompt + call + result + answer).
"""

from __future__ import annotations

from typing import Any

from rz_agents.envs.python_tool import PythonToolEnv


class ArithmeticToolEnv(PythonToolEnv):
    """PythonToolEnv on generated arithmetic, compact prompt, tools known from training, not the prompt."""

    def __init__(self, difficulty: int = 2, max_turns: int = 3, **kwargs: Any) -> None:
        kwargs.setdefault("prompt_style", "compact")
        kwargs.setdefault("system_prompt", None)
        kwargs.setdefault("advertise_tools", False)  # the policy knows its one tool from the warm start
        super().__init__(max_turns=max_turns, difficulty=difficulty, **kwargs)
