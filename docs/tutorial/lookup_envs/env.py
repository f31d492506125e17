"""KeyLookup: ask a tool for the code of a key, then answer with the code.

A task is ``{"id": ..., "key": "q", "code": "x"}`` (one letter each; a key's code differs between tasks,
so only the tool knows it). The policy's first turn calls the tool in the env's own compact syntax,
``lookup q``; the tool's answer comes back as a ``tool`` message; the next turn is the answer. Reward 1.0
for the exact code, 0 otherwise.
"""

from __future__ import annotations

import re
from typing import Any

from rz_agents.envs import MultiTurnTextEnv

CALL = re.compile(r"^lookup (\S+)$")


class KeyLookupEnv(MultiTurnTextEnv):
    def __init__(self, max_turns: int = 3) -> None:
        super().__init__(max_turns=max_turns)

    def _reset(self, task: dict[str, Any] | None, rng) -> tuple[list[dict], dict]:
        if task is None:  # no task list: draw one
            letters = list("abcdefghijklmnopqrstuvwxyz")
            task = {"key": str(rng.choice(letters)), "code": str(rng.choice(letters))}
        self.key, self.code = task["key"], task["code"]
        prompt = f"Code of {self.key}? Ask: lookup KEY"
        return [{"role": "user", "content": prompt}], {"task_id": task.get("id", self.key), "tools": []}

    def _step(self, text: str) -> tuple[Any, float, bool, dict]:
        call = CALL.match(text.strip())
        if call:  # the tool's answer, as a tool message
            key = call.group(1)
            result = self.code if key == self.key else "unknown key"
            return [{"role": "tool", "content": result}], 0.0, False, {"looked_up": key}
        return None, float(text.strip() == self.code), True, {"answer": text.strip()}
