"""Kimi's chat format (Kimi K2 Instruct, Kimi Linear Instruct), written in Python, append-only.

Rendering follows Kimi K2 Instruct's jinja ``chat_template`` (the ``<|im_system|>`` / ``<|im_user|>`` /
``<|im_assistant|>`` family), text for text as transformers renders it:

- a message is ``{role marker}{name}<|im_middle|>{body}<|im_end|>``, with no newline between messages; the
  role name is the message's ``name`` or its role; system and tool messages use ``<|im_system|>`` and (a
  quirk of the template's whitespace) a newline after ``<|im_middle|>``;
- tools are declared first:
  ``<|im_system|>tool_declare<|im_middle|>\\n  # Tools\\n  {tools as JSON}<|im_end|>``;
- without a system message first, the default one (``You are Kimi, ...``) opens the conversation;
- an assistant's calls follow its content as ``<|tool_calls_section_begin|>`` +
  ``<|tool_call_begin|>{id}<|tool_call_argument_begin|>{json}<|tool_call_end|>`` per call +
  ``<|tool_calls_section_end|>``; the id is ``functions.{name}:{index}`` (``index`` counts the calls of the
  conversation from 0), taken from the call's ``id`` when it has one;
- a tool result is ``## Return of {tool_call_id}\\n    {content}`` (an empty id when the message has none);
- the generation prompt is ``<|im_assistant|>assistant<|im_middle|>``; the format has no think block
  (``enable_thinking`` changes nothing; ``reasoning_content`` is not rendered, as in the jinja).

Every turn renders the same wherever it sits, so rendering is append-only as it is in the jinja. Differences:
a call without an ``id`` gets ``functions.{name}:{index}`` (the jinja would write an empty id, losing the
name); the bare ``{"name", "arguments"}`` call shape is taken too. Not rendered: image parts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rz_agents.kimi_tokens import (
    CALL_ID_PREFIX,
    EOS,
    IM_ASSISTANT,
    IM_END,
    IM_MIDDLE,
    IM_SYSTEM,
    IM_USER,
    TOOL_CALL_ARGUMENT_BEGIN,
    TOOL_CALL_BEGIN,
    TOOL_CALL_END,
    TOOL_CALLS_SECTION_BEGIN,
    TOOL_CALLS_SECTION_END,
)
from rz_agents.model.chat_messages import (
    Message,
    RenderedTemplate,
    TextEncoder,
    call_function,
    check_tools,
    required_id,
    stop_ids,
    tool_calls_of,
)
from rz_agents.model.chat_messages import check_messages as _check_messages
from rz_agents.model.chat_messages import message_content as _content

KIMI_DEFAULT_SYSTEM_PROMPT = "You are Kimi, an AI assistant created by Moonshot AI."
KIMI_MODEL_TYPES = ("kimi_linear", "kimi_k2")
_HEADS = {"user": IM_USER, "assistant": IM_ASSISTANT}


def _tojson(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)  # transformers' `tojson` filter


def render_kimi_call(call: Any, index: int, call_index: int) -> str:
    """One call as ``<|tool_call_begin|>{id}<|tool_call_argument_begin|>{arguments}<|tool_call_end|>``."""
    name, arguments = call_function(call, index)
    call_id = call.get("id") or f"{CALL_ID_PREFIX}{name}:{call_index}"
    text = arguments if isinstance(arguments, str) else _tojson(arguments)
    return f"{TOOL_CALL_BEGIN}{call_id}{TOOL_CALL_ARGUMENT_BEGIN}{text}{TOOL_CALL_END}"


@dataclass(frozen=True)
class KimiChatTemplate(RenderedTemplate):
    """Kimi's chat format with `ChatTemplate`'s interface (render, render_continuation, encode_prompt,
    encode_continuation, stop_token_ids); see the module docstring."""

    tool_call_format = "kimi"  # tool calls as rz_agents.envs parses them (RenderedTemplate)

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool = True,
    ) -> str:
        """The conversation as prompt text (messages as for `ChatTemplate.render`, plus the optional ``name``
        of a message and ``tool_call_id`` of a tool result)."""
        _check_messages(messages)
        parts = []
        if tools:
            check_tools(tools)
            parts.append(f"{IM_SYSTEM}tool_declare{IM_MIDDLE}\n  # Tools\n  {_tojson(list(tools))}{IM_END}")
        if messages and messages[0]["role"] != "system":
            parts.append(f"{IM_SYSTEM}system{IM_MIDDLE}{KIMI_DEFAULT_SYSTEM_PROMPT}{IM_END}")
        parts.append(self._render_turns(messages))
        return "".join(parts) + (self.generation_prompt() if add_generation_prompt else "")

    def generation_prompt(self, enable_thinking: bool = True) -> str:
        """What opens the assistant's turn (the same with thinking on or off)."""
        return f"{IM_ASSISTANT}assistant{IM_MIDDLE}"

    def render_continuation(self, new_messages: Sequence[Message], enable_thinking: bool = True) -> str:
        """Text that follows an assistant turn's closing ``<|im_end|>``: the new turns + generation prompt."""
        _check_messages(new_messages)
        return self._render_turns(new_messages) + self.generation_prompt()

    def _render_turns(self, messages: Sequence[Message]) -> str:
        parts: list[str] = []
        calls_so_far = 0
        for i, message in enumerate(messages):
            role = message["role"]
            name = message.get("name") or role
            if role in _HEADS:
                parts.append(f"{_HEADS[role]}{name}{IM_MIDDLE}")
            else:
                parts.append(f"{IM_SYSTEM}{name}{IM_MIDDLE}\n")
            content = _content(message, i)
            tool_calls = tool_calls_of(message, i) if role == "assistant" else []
            if tool_calls:
                calls = "".join(render_kimi_call(c, i, calls_so_far + k) for k, c in enumerate(tool_calls))
                calls_so_far += len(tool_calls)
                parts.append(f"{content}{TOOL_CALLS_SECTION_BEGIN}{calls}{TOOL_CALLS_SECTION_END}")
            elif role == "tool":
                call_id = message["tool_call_id"] if "tool_call_id" in message else ""  # as jinja prints it
                parts.append(f"## Return of {call_id}\n    {content}")
            else:
                parts.append(content)
            parts.append(IM_END)
        return "".join(parts)

    def turn_end_id(self, tokenizer: TextEncoder) -> int:
        """``<|im_end|>``: put in front of a continuation after a cut-off turn (`RenderedTemplate`)."""
        return required_id(tokenizer, IM_END, "Kimi")

    def stop_token_ids(self, tokenizer: TextEncoder) -> list[int]:
        """Ids that end an assistant turn: ``<|im_end|>``, then ``[EOS]`` if the vocabulary has it."""
        return stop_ids(tokenizer, IM_END, [EOS], "Kimi")


KIMI_CHAT_TEMPLATE = KimiChatTemplate()
