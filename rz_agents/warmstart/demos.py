"""Synthetic tool-use demonstrations, tokenized exactly as the rollout would tokenize them.

A demonstration is a scripted episode: the prompt and observations are rendered with the run's
chat template (`encode_prompt` / `encode_continuation`, the same calls the agent loop makes), and
the assistant turns are the tokens a policy would have sampled, closed by the template's stop token.
The loss mask covers the assistant tokens only.

`arithmetic_tool_demos` mixes two behaviours, like a base model that rarely uses its tools:
- with probability `tool_fraction`: call the python tool with the expression, then box its output;
- otherwise: answer directly with a guessed number (a wrong answer almost always).
RL then has to discover that calling the tool pays; the warm start only teaches the format.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from rz_agents.data import arithmetic_task
from rz_agents.data.word_problems import word_problem


@dataclass
class Demonstration:
    tokens: list[int]
    loss_mask: list[bool]  # True on assistant (policy) tokens
    uses_tool: bool
    images: list[bytes] = field(default_factory=list)  # PNG bytes of the prompt's images, in order


def tool_call_text(code: str) -> str:
    """The assistant turn that calls the python tool (Qwen3/Hermes format, compact JSON)."""
    payload = json.dumps({"name": "python", "arguments": {"code": code}}, separators=(",", ":"))
    return f"<tool_call>{payload}</tool_call>"


def _guess(rng: random.Random, answer: str) -> str:
    digits = max(1, len(answer.lstrip("-")) + rng.choice([-1, 0, 0, 1]))
    value = str(rng.randint(10 ** (digits - 1) if digits > 1 else 0, 10**digits - 1))
    if value == answer:
        value = str(int(value) + 1)
    return ("-" if answer.startswith("-") and rng.random() < 0.7 else "") + value


def _episode(
    tokenizer: Any, template: Any, turns: list[tuple[str, list[dict]]], prompt: list[dict]
) -> tuple[list[int], list[bool]]:
    tokens = list(template.encode_prompt(tokenizer, prompt))
    mask = [False] * len(tokens)
    stop = template.stop_token_ids(tokenizer)[0]
    for i, (assistant_text, observation) in enumerate(turns):
        sampled = list(tokenizer.encode(assistant_text)) + [stop]
        tokens += sampled
        mask += [True] * len(sampled)
        if i + 1 < len(turns):
            cont = list(template.encode_continuation(tokenizer, observation))
            tokens += cont
            mask += [False] * len(cont)
    return tokens, mask


def arithmetic_tool_demos(
    tokenizer: Any,
    template: Any,
    n: int,
    *,
    seed: int = 0,
    difficulty: int = 2,
    tool_fraction: float = 0.3,
) -> list[Demonstration]:
    """`n` demonstrations on generated arithmetic (see module docstring)."""
    return tool_demos(
        tokenizer, template, n, arithmetic_task, seed=seed, difficulty=difficulty, tool_fraction=tool_fraction
    )


def word_problem_tool_demos(
    tokenizer: Any,
    template: Any,
    n: int,
    *,
    seed: int = 0,
    difficulty: int = 1,
    tool_fraction: float = 1.0,
) -> list[Demonstration]:
    """`n` demonstrations on generated GSM8K-style word problems: the call holds the problem's
    expression (the translation of the story into code), then the tool's output is boxed."""
    return tool_demos(
        tokenizer, template, n, word_problem, seed=seed, difficulty=difficulty, tool_fraction=tool_fraction
    )


DEMO_TASKS = {"arithmetic": arithmetic_tool_demos, "word_problems": word_problem_tool_demos}


def tool_demos(
    tokenizer: Any,
    template: Any,
    n: int,
    make_task: Any,
    *,
    seed: int = 0,
    difficulty: int = 2,
    tool_fraction: float = 0.3,
) -> list[Demonstration]:
    """`n` demonstrations on tasks ``make_task(rng, difficulty, index=, seed=)`` with an ``expression``."""
    rng = random.Random(f"rz-demos:{seed}")
    demos = []
    for i in range(n):
        task = make_task(rng, difficulty, index=i, seed=seed)
        prompt = [{"role": "user", "content": task["question"]}]
        if rng.random() < tool_fraction:
            turns = [
                (tool_call_text(task["expression"]), [{"role": "tool", "content": task["answer"]}]),
                (f"\\boxed{{{task['answer']}}}", []),
            ]
            uses_tool = True
        else:
            turns = [(f"\\boxed{{{_guess(rng, task['answer'])}}}", [])]
            uses_tool = False
        tokens, mask = _episode(tokenizer, template, turns, prompt)
        demos.append(Demonstration(tokens, mask, uses_tool))
    return demos
