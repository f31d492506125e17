"""Chat messages as the chat templates take them (role/content dicts) and what a template needs from a
tokenizer; shared by the ChatML template (`chat_template`) and DeepSeek's (`deepseek_chat`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol

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


def required_id(tokenizer: TextEncoder, token: str, format_name: str = "ChatML") -> int:
    """The id of `token`, or a one-line error saying the tokenizer does not use `format_name`."""
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise ValueError(f"the tokenizer has no {token} token: it does not use the {format_name} format")
    return token_id


def stop_ids(tokenizer: TextEncoder, turn_end: str, others: Sequence[str], format_name: str) -> list[int]:
    """Ids that end an assistant turn: `turn_end` (required), then each of `others` the vocabulary has."""
    ids = [required_id(tokenizer, turn_end, format_name)]
    for token in others:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None and token_id not in ids:
            ids.append(token_id)
    return ids


def check_tools(tools: Any) -> None:
    """Refuse `tools` that are not a list of tool dicts."""
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise TypeError(f"tools must be a list of dicts, got {type(tools).__name__}")


def tool_calls_of(message: Message, index: int) -> Sequence[Any]:
    """An assistant message's ``tool_calls`` (empty when it has none); anything but a list is refused."""
    tool_calls = message.get("tool_calls") or []
    if isinstance(tool_calls, (str, bytes, Mapping)) or not isinstance(tool_calls, Sequence):
        raise TypeError(f"message {index}: tool_calls must be a list, got {type(tool_calls).__name__}")
    return tool_calls


def call_function(call: Any, index: int) -> tuple[str, Any]:
    """(name, arguments) of one tool call in the OpenAI shape ``{"function": {...}}`` or the bare
    ``{"name", "arguments"}`` one (arguments as given: a dict or a JSON string)."""
    if not isinstance(call, Mapping):
        raise TypeError(f"message {index}: each tool call must be a dict, got {type(call).__name__}")
    call = call.get("function") or call
    name = call.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"message {index}: tool call without a function name: {call!r}")
    if "arguments" not in call:
        raise ValueError(f"message {index}: tool call {name!r} has no 'arguments'")
    return name, call["arguments"]


def object_arguments(arguments: Any, name: str, index: int) -> Mapping[str, Any]:
    """A call's arguments as a mapping (a JSON string is parsed); anything else is refused in one line."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise ValueError(f"message {index}: tool call {name!r} has arguments that are not JSON") from exc
    if not isinstance(arguments, Mapping):
        raise ValueError(f"message {index}: tool call {name!r} needs a JSON object of arguments")
    return arguments


class RenderedTemplate:
    """Token ids of a chat template's text: ``encode_prompt`` of ``render``, ``encode_continuation`` of
    ``render_continuation`` with the turn-end token put in front when the sampled turn was cut off. Shared
    by ChatML (model/chat_template.py) and DeepSeek's formats (model/deepseek_chat.py, deepseek_dsml.py),
    each naming its turn-end id (``turn_end_id``).

    ``tool_call_format`` names the format the model writes its tool calls in, so a reader of replies (``rz
    serve``'s ``serve/tool_formats.py``) picks the parser from the template, never from the model family:
    ``"json"`` (Qwen3/Hermes ``<tool_call>`` JSON), ``"xml"`` (Qwen3-Coder / Qwen3.5), ``"kimi"``,
    ``"deepseek"``, ``"dsml"``."""

    tool_call_format: ClassVar[str] = "json"

    def turn_end_id(self, tokenizer: TextEncoder) -> int:  # (each template's own)
        raise NotImplementedError

    def generation_prompt(self, enable_thinking: bool = True) -> str:  # (each template's own)
        raise NotImplementedError

    def opens_think(self, enable_thinking: bool = True) -> bool:
        """True when the generation prompt leaves a think block open (the reply starts in the reasoning)."""
        return self.generation_prompt(enable_thinking).endswith("<think>\n")

    def encode_prompt(
        self,
        tokenizer: TextEncoder,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool = True,
    ) -> list[int]:
        """Token ids of `render(...)`: the prompt a rollout starts from."""
        return tokenizer.encode(self.render(messages, tools, add_generation_prompt, enable_thinking))

    def encode_continuation(
        self,
        tokenizer: TextEncoder,
        new_messages: Sequence[Message],
        enable_thinking: bool = True,
        assistant_closed: bool = True,
    ) -> list[int]:
        """Tokens to append after the assistant's sampled tokens: ``encode(render_continuation(...))``; when
        the turn was cut off (``assistant_closed=False``) the turn-end id is put in front, so prompt + sampled
        + continuation equals the tokens of the re-rendered conversation."""
        ids = tokenizer.encode(self.render_continuation(new_messages, enable_thinking))
        if not assistant_closed:
            ids = [self.turn_end_id(tokenizer), *ids]
        return ids
