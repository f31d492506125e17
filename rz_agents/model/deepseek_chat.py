"""DeepSeek's own chat format (DeepSeek-V3.1 and its tool-call format), written in Python, append-only.

Facts taken from DeepSeek-V3.1's published jinja ``chat_template`` (tokenizer_config.json of
deepseek-ai/DeepSeek-V3.1, as logged verbatim in llama.cpp/ik_llama.cpp issue threads) and its model card's
"ToolCall" section (the tools block, as vLLM's examples/tool_chat_template_deepseekv31.jinja writes it):

- ``<｜begin▁of▁sentence｜>`` then the system prompt (all system messages joined by a blank line, the tools
  block after another blank line), with no role marker;
- a user turn is ``<｜User｜>{content}``; the assistant turn after it opens ``<｜Assistant｜>`` followed by
  ``</think>`` (thinking off) or ``<think>`` (thinking on: the model writes ``{reasoning}</think>{answer}``);
- an assistant turn ends ``<｜end▁of▁sentence｜>``; its tool calls follow its content as
  ``<｜tool▁calls▁begin｜>`` +
  ``<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{json arguments}<｜tool▁call▁end｜>`` per call +
  ``<｜tool▁calls▁end｜>``;
- a tool result is ``<｜tool▁output▁begin｜>{content}<｜tool▁output▁end｜>``, and the assistant continues
  right after the last one with no header (the official template adds no generation prompt after tool
  results).

One deliberate difference makes rendering append-only (rollouts never re-tokenize): the official template
drops an earlier assistant turn's thinking (the text before ``</think>``) and renders ``</think>`` in its
header; here a turn renders as what the model saw and wrote (``<think>`` + reasoning + ``</think>`` + answer).
With thinking off the two agree token for token (tested against a string derived from the official template).

DeepSeek-V3.2 and V4 publish a Python encoder (DSML tool calls, ``encoding_dsv32.py``) and no jinja template:
that format is `rz_agents.model.deepseek_dsml`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rz_agents.deepseek_tokens import (
    ASSISTANT,
    BOS,
    EOS,
    THINK_CLOSE,
    THINK_OPEN,
    TOOL_CALL_BEGIN,
    TOOL_CALL_END,
    TOOL_CALLS_BEGIN,
    TOOL_CALLS_END,
    TOOL_OUTPUT_BEGIN,
    TOOL_OUTPUT_END,
    TOOL_SEP,
    USER,
)
from rz_agents.model.chat_messages import (
    Message,
    RenderedTemplate,
    TextEncoder,
    call_function,
    check_tools,
    tool_calls_of,
)
from rz_agents.model.chat_messages import check_messages as _check_messages
from rz_agents.model.chat_messages import message_content as _content

# DeepSeek-V3.1 model card, "ToolCall": the tools block appended to the system prompt.
TOOLS_HEADER = "## Tools\nYou have access to the following tools:\n"
TOOLS_FOOTER = (
    "\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n"
    f"{TOOL_CALLS_BEGIN}{TOOL_CALL_BEGIN}tool_call_name{TOOL_SEP}tool_call_arguments{TOOL_CALL_END}"
    "{{additional_tool_calls}}" + TOOL_CALLS_END + "\n\nWhere:\n\n"
    "- `tool_call_name` must be an exact match to one of the available tools\n"
    "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n"
    "- For multiple tool calls, chain them directly without separators or spaces\n"
)


def _tojson(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)  # transformers' `tojson` filter


def render_tool_call(call: Any, index: int) -> str:
    """One call as ``<｜tool▁call▁begin｜>name<｜tool▁sep｜>{json}<｜tool▁call▁end｜>``
    (the OpenAI or the bare ``{"name", "arguments"}`` shape)."""
    name, arguments = call_function(call, index)
    text = arguments if isinstance(arguments, str) else _tojson(arguments)
    return f"{TOOL_CALL_BEGIN}{name}{TOOL_SEP}{text}{TOOL_CALL_END}"


def _tools_block(tools: Sequence[Mapping[str, Any]]) -> str:
    check_tools(tools)
    parts = [TOOLS_HEADER]
    for tool in tools:
        fn = tool.get("function", tool)
        parts.append(
            f"\n### {fn['name']}\nDescription: {fn.get('description', '')}\n\n"
            f"Parameters: {_tojson(fn.get('parameters', {}))}\n"
        )
    return "".join(parts) + TOOLS_FOOTER


class DeepSeekEncoding(RenderedTemplate):
    """Token ids of a DeepSeek template's text (`render`, `render_continuation`) and its stop token; shared by
    V3.1's format and V3.2 / V4's DSML one (`rz_agents.model.deepseek_dsml`)."""

    def turn_end_id(self, tokenizer: TextEncoder) -> int:
        """``<｜end▁of▁sentence｜>``: put in front of a continuation after a cut-off turn."""
        return _eos_id(tokenizer)

    def stop_token_ids(self, tokenizer: TextEncoder) -> list[int]:
        """Ids that end an assistant turn: ``<｜end▁of▁sentence｜>``."""
        return [_eos_id(tokenizer)]


@dataclass(frozen=True)
class DeepSeekChatTemplate(DeepSeekEncoding):
    """DeepSeek-V3.1's chat and tool-call format, with `ChatTemplate`'s interface (render, encode_prompt,
    encode_continuation, stop_token_ids). ``enable_thinking`` is the official template's ``thinking``."""

    tool_call_format = "deepseek"  # tool calls as rz_agents.envs parses them (RenderedTemplate)

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool = True,
    ) -> str:
        """The conversation as prompt text (messages as for `ChatTemplate.render`; system messages first)."""
        _check_messages(messages)
        n_system = 0
        while n_system < len(messages) and messages[n_system]["role"] == "system":
            n_system += 1
        system = "\n\n".join(_content(messages[i], i) for i in range(n_system))
        if tools:
            system += "\n\n" + _tools_block(tools)
        body = self._render_turns(messages, n_system, enable_thinking, previous=None)
        text = BOS + system + body
        if add_generation_prompt:
            last = messages[-1]["role"] if len(messages) > n_system else None
            text += self._opening(last, enable_thinking)
        return text

    @staticmethod
    def _opening(previous: str | None, enable_thinking: bool) -> str:
        # The official template opens the assistant's turn only after a user turn: after tool results the
        # model continues at once (no header), and it writes no header of its own.
        if previous == "tool":
            return ""
        return ASSISTANT + (THINK_OPEN if enable_thinking else THINK_CLOSE)

    def _render_turns(
        self, messages: Sequence[Message], start: int, enable_thinking: bool, previous: str | None
    ) -> str:
        parts: list[str] = []
        for i in range(start, len(messages)):
            message = messages[i]
            role, content = message["role"], _content(message, i)
            if role == "system":
                raise ValueError(
                    f"message {i}: DeepSeek's format puts every system message in front of the first turn; "
                    "a system message after other turns cannot be rendered append-only"
                )
            if role == "user":
                parts.append(USER + content)
            elif role == "tool":
                parts.append(TOOL_OUTPUT_BEGIN + content + TOOL_OUTPUT_END)
            else:
                opened = previous != "tool"
                if opened:
                    parts.append(self._opening(previous, enable_thinking))
                parts.append(self._assistant_body(message, i, content, opened and enable_thinking))
            previous = role
        return "".join(parts)

    @staticmethod
    def _assistant_body(message: Message, index: int, content: str, thinking: bool) -> str:
        reasoning = message.get("reasoning_content")
        # With thinking on the turn opened "<think>": the model wrote its reasoning, "</think>", the answer.
        body = (reasoning + THINK_CLOSE + content) if thinking and isinstance(reasoning, str) else content
        tool_calls = tool_calls_of(message, index)
        if tool_calls:
            calls = "".join(render_tool_call(call, index) for call in tool_calls)
            body += TOOL_CALLS_BEGIN + calls + TOOL_CALLS_END
        return body + EOS

    def generation_prompt(self, enable_thinking: bool = True) -> str:
        """What opens the assistant's turn after a user turn."""
        return self._opening("user", enable_thinking)

    def render_continuation(self, new_messages: Sequence[Message], enable_thinking: bool = True) -> str:
        """Text that follows an assistant turn's closing ``<｜end▁of▁sentence｜>``: the new turns + the
        assistant's opening (none after tool results)."""
        _check_messages(new_messages)
        text = self._render_turns(new_messages, 0, enable_thinking, previous="assistant")
        last = new_messages[-1]["role"] if new_messages else "user"
        return text + self._opening(last, enable_thinking)


def _eos_id(tokenizer: TextEncoder) -> int:
    token_id = tokenizer.token_to_id(EOS)
    if token_id is None:
        raise ValueError(f"the tokenizer has no {EOS} token: it does not use DeepSeek's chat format")
    return token_id


DEEPSEEK_V31_CHAT_TEMPLATE = DeepSeekChatTemplate()
