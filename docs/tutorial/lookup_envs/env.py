"""KeyLookup: find the code of a key with a ``lookup`` tool, then answer with the code.

A task is ``{"id": ..., "key": "q", "code": "x"}`` (one letter each; a key's code differs between tasks). The policy cannot know the code: it must call
``lookup`` with the task's key (one turn), read the tool's answer, and reply with the code (next turn).
Reward 1.0 for the exact code, 0 otherwise.
"""

from __future__ import annotations

from typing import Any

from rz_agents.envs import MultiTurnTextEnv
from rz_agents.envs.tool_calls import parse_tool_calls

# The tool's schema, shown to the policy in its prompt (kept short: a tiny policy reads it every episode).
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}},
    },
}


class KeyLookupEnv(MultiTurnTextEnv):
    def __init__(self, max_turns: int = 3) -> None:
        super().__init__(max_turns=max_turns)
        self.tools = [LOOKUP]

    def _reset(self, task: dict[str, Any] | None, rng) -> tuple[list[dict], dict]:
        if task is None:  # no task list: draw one
            letters = "abcdefghijklmnopqrstuvwxyz"
            task = {
                "key": "".join(rng.choice(list(letters), 4)),
                "code": "".join(rng.choice(list(letters), 3)),
            }
        self.key, self.code = task["key"], task["code"]
        prompt = f"Code of {self.key}?"
        return [{"role": "user", "content": prompt}], {
            "task_id": task.get("id", self.key),
            "tools": self.tools,
        }

    def _step(self, text: str) -> tuple[Any, float, bool, dict]:
        turn = parse_tool_calls(text, self.tools)
        if turn.calls:
            key = turn.calls[0].arguments["key"]
            return (self.code if key == self.key else "unknown key"), 0.0, False, {"looked_up": key}
        if turn.errors:
            return turn.errors[0].message, 0.0, False, {"error": "bad_call"}
        return None, float(text.strip() == self.code), True, {"answer": text.strip()}
