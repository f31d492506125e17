"""The multi-turn text environment contract shared by every rz_agents env.

An episode is a chat: ``reset`` returns the opening messages (an optional system message and the
user prompt), each ``step`` takes the policy's decoded turn text and returns the *new* messages
(tool results, feedback) since the last step. An env knows nothing of tokens: the rollout loop
renders messages with the model's chat template.

Subclasses implement ``_reset(task, rng)`` and ``_step(text)``; the base class owns turn counting,
truncation at ``max_turns``, observation normalisation and the guard rails (stepping before reset
or after the episode ended is a clear error, not a silent reset).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from rz_agents.images import check_content

# {"role": "system"|"user"|"assistant"|"tool", "content": str or a list of text/image parts}
# (the parts' shape: rz_agents.images)
Message = dict[str, Any]
ToolSpec = dict[str, Any]  # OpenAI/Qwen3 function format: {"type": "function", "function": {...}}

ROLES = ("system", "user", "assistant", "tool")


class ChatMessages(spaces.Space):
    """Observation space: a list of ``{"role", "content"}`` chat messages (possibly empty).

    ``content`` is a string, or a list of text and image parts (``rz_agents.images``)."""

    def __init__(self) -> None:
        super().__init__(shape=None, dtype=None)

    def contains(self, x: Any) -> bool:
        """True when ``x`` is a list of messages with a known role and string (or parts) content."""
        return isinstance(x, list) and all(
            isinstance(m, dict) and m.get("role") in ROLES and _content_ok(m.get("content")) for m in x
        )

    def sample(self, mask: Any = None, probability: Any = None) -> list[Message]:
        """A random one-message observation (only useful for smoke tests)."""
        n = int(self.np_random.integers(0, 1000))
        return [{"role": "user", "content": f"message {n}"}]

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "ChatMessages()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ChatMessages)


class TurnText(spaces.Space):
    """Action space: the policy's decoded turn, any ``str``."""

    def __init__(self) -> None:
        super().__init__(shape=None, dtype=None)

    def contains(self, x: Any) -> bool:
        """True when ``x`` is a string."""
        return isinstance(x, str)

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A random short answer (only useful for smoke tests)."""
        return f"\\boxed{{{int(self.np_random.integers(0, 1000))}}}"

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "TurnText()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TurnText)


def _content_ok(content: Any) -> bool:
    try:
        check_content(content)
    except ValueError:
        return False
    return True


def as_messages(obs: str | Message | Sequence[Message] | None, role: str = "user") -> list[Message]:
    """Normalise an observation to a list of messages.

    A plain string means one message with ``role`` (``"user"`` or ``"tool"``); ``None`` means no
    new message. A message's content is a string or a list of text/image parts
    (``rz_agents.images``). Raises ``ValueError`` naming the problem for anything else.
    """
    if obs is None:
        return []
    if isinstance(obs, str):
        return [{"role": role, "content": obs}]
    if isinstance(obs, dict):
        obs = [obs]
    if not isinstance(obs, (list, tuple)):
        raise TypeError(
            f"an observation must be a str, a {{'role', 'content'}} message dict, a list of them or None; "
            f"got {type(obs).__name__} {obs!r:.80}"
        )
    out: list[Message] = []
    for i, m in enumerate(obs):
        if not isinstance(m, dict) or m.get("role") not in ROLES or "content" not in m:
            raise ValueError(
                f"observation message {i} must be a dict with role in {ROLES} and str content, got {m!r:.200}"
            )
        content = m["content"]
        check_content(content, f"observation message {i} content")
        out.append({"role": m["role"], "content": content if isinstance(content, str) else list(content)})
    return out


def _checked(obs: Any, method: str, role: str) -> list[Message]:
    """``as_messages(obs)``, or a TypeError naming the method that returned the bad observation."""
    try:
        return as_messages(obs, role=role)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{method} returned a bad observation: {exc}") from None


class MultiTurnTextEnv(gymnasium.Env):
    """A multi-turn text environment.

    Observations are lists of chat messages (the *new* messages since the last step; ``reset``
    returns the initial prompt: optional system message + user message). Actions are the policy's
    decoded turn text (``str``). Subclasses implement ``_reset(task, rng)`` and ``_step(text)``.

    ``reset`` info carries at least ``"tools"`` (JSON-schema tool specs in the OpenAI/Qwen3
    function format, ``[]`` when none) and ``"task_id"``; ``step`` info carries ``"turn"`` (turns
    taken so far). ``truncated`` is True when ``max_turns`` is reached without termination.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, max_turns: int = 4) -> None:
        if not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns must be a positive int, got {max_turns!r}")
        self.max_turns = max_turns
        self.observation_space = ChatMessages()
        self.action_space = TurnText()
        self.turn = 0
        self.task_id: str | None = None
        self.tools: list[ToolSpec] = []
        self._done = True  # no episode yet: step() before reset() is an error
        self._started = False

    # --- to implement -------------------------------------------------------------------------
    def _reset(
        self, task: dict[str, Any] | None, rng: np.random.Generator
    ) -> tuple[list[Message] | str, dict]:
        """Start an episode for ``task`` (or one drawn with ``rng`` when None).

        Return the opening messages and an info dict; put ``"task_id"`` and ``"tools"`` in it (the
        base class fills ``task_id`` from ``task["id"]`` and ``tools`` from ``self.tools`` if absent).
        """
        raise NotImplementedError

    def _step(self, text: str) -> tuple[list[Message] | str | None, float, bool, dict]:
        """Apply the policy's turn ``text``; return ``(new_messages, reward, terminated, info)``.

        A plain string observation is sent as one ``"tool"`` message when the env has tools, else
        as a ``"user"`` message.
        """
        raise NotImplementedError

    def _on_truncate(self) -> float:
        """Extra reward added when the turn limit ends the episode (default 0)."""
        return 0.0

    # --- the Gymnasium contract ---------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start a new episode; ``options={"task": {...}}`` picks the task."""
        super().reset(seed=seed)
        task = (options or {}).get("task")
        if task is not None and not isinstance(task, dict):
            raise TypeError(f"options['task'] must be a dict, got {type(task).__name__}")
        obs, info = self._reset(task, self.np_random)
        messages = _checked(obs, f"{type(self).__name__}._reset", role="user")
        info = dict(info or {})
        info.setdefault("tools", list(self.tools))
        if "task_id" not in info:
            info["task_id"] = str(task["id"]) if task is not None and "id" in task else None
        self.task_id = info["task_id"]
        self.turn = 0
        self._done = False
        self._started = True
        return messages, info

    def step(self, action: str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Apply one policy turn; returns ``(obs, reward, terminated, truncated, info)``."""
        if not self._started:
            raise RuntimeError(f"{type(self).__name__}.step() called before reset()")
        if self._done:
            raise RuntimeError(f"{type(self).__name__}.step() called after the episode ended; call reset()")
        if not isinstance(action, str):
            raise TypeError(f"action must be the decoded turn text (str), got {type(action).__name__}")
        obs, reward, terminated, info = self._step(action)
        messages = _checked(obs, f"{type(self).__name__}._step", role="tool" if self.tools else "user")
        self.turn += 1
        info = dict(info or {})
        info["turn"] = self.turn
        truncated = False
        if not terminated and self.turn >= self.max_turns:
            truncated = True
            reward = float(reward) + self._on_truncate()
        self._done = bool(terminated or truncated)
        return messages, float(reward), bool(terminated), truncated, info

    def close(self) -> None:
        """Free the env's resources (sandboxes, browsers); safe to call twice."""
        self._done = True
