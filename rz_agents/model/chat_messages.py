"""Chat messages as the chat templates take them (role/content dicts) and what a template needs from a
tokenizer; shared by the ChatML template (`chat_template`) and DeepSeek's (`deepseek_chat`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

ROLES = ("system", "user", "assistant", "tool")

Message = Mapping[str, Any]


class TextEncoder(Protocol):
    """What the chat template needs from a tokenizer (`rz_agents.model.tokenizer.Tokenizer` fits)."""

    def encode(self, text: str) -> list[int]: ...

    def token_to_id(self, token: str) -> int | None: ...


def message_content(message: Message, index: int) -> str:
    """A message's text content ("" for None); anything but a str or None is refused."""
    content = message.get("content")
    if content is None:
        return ""
    if not isinstance(content, str):
        raise TypeError(
            f"message {index} ({message.get('role')}): content must be a str or None, got "
            f"{type(content).__name__}"
        )
    return content


def check_messages(messages: Sequence[Message]) -> None:
    """Refuse, with the offending message's index, anything that is not a list of well-formed messages."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TypeError(f"messages must be a list of dicts, got {type(messages).__name__}")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TypeError(
                f"message {i} must be a dict with 'role' and 'content', got {type(message).__name__}"
            )
        role = message.get("role")
        if role not in ROLES:
            raise ValueError(f"message {i}: role must be one of {ROLES}, got {role!r}")
        message_content(message, i)
        reasoning = message.get("reasoning_content")
        if reasoning is not None and not isinstance(reasoning, str):
            raise TypeError(f"message {i}: reasoning_content must be a str, got {type(reasoning).__name__}")
