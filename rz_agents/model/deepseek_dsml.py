"""DeepSeek-V3.2's and DeepSeek-V4's chat format with DSML tool calls, written in Python, append-only.

These checkpoints ship no jinja template: the format is defined by the Python encoders published with them
(``encoding/encoding_dsv32.py`` of deepseek-ai/DeepSeek-V3.2, ``encoding/encoding_dsv4.py`` of the V4
releases; vLLM and SGLang carry copies). What they write:

- ``<｜begin▁of▁sentence｜>`` then the system prompt with no role marker, the tools block after a blank line;
- a user turn is ``<｜User｜>{content}``; the assistant's turn opens ``<｜Assistant｜>`` then ``<think>``
  (thinking mode: the model writes ``{reasoning}</think>{answer}``) or ``</think>`` (chat mode);
- an assistant turn is ``{answer}`` + its calls + ``<｜end▁of▁sentence｜>``; the calls follow a blank line
  as a DSML block (``function_calls`` in V3.2, ``tool_calls`` in V4) of ``<｜DSML｜invoke name="...">``
  elements, one ``<｜DSML｜parameter name="k" string="true|false">v</｜DSML｜parameter>`` per argument
  (strings as they are, anything else as JSON), all joined by newlines;
- tool results: V3.2 writes ``\\n\\n<function_results>`` + ``\\n<result>{content}</result>`` per result +
  ``\\n</function_results>`` + ``\\n\\n`` + the think token, and the assistant continues with no header;
  V4 merges them into a user turn, ``<｜User｜><tool_result>{content}</tool_result>`` (results and any user
  text after them joined by blank lines), then opens the assistant's turn as after a user turn.

One deliberate difference makes rendering append-only (rollouts never re-tokenize), as for V3.1
(`rz_agents.model.deepseek_chat`): the encoders drop the thinking of assistant turns before the last user turn
and open those earlier turns with ``</think>``; here every turn renders as the model saw and wrote it. The two
agree token for token in chat mode, in thinking mode while there is one user turn (the agent case: one task,
many tool rounds), and for V4 in thinking mode whenever tools are given (its encoder keeps all thinking then).
Not rendered: V4's ``developer`` / ``latest_reminder`` roles, task tokens, response formats, images and the
reasoning-effort prefixes (the default effort adds nothing); tool results keep the order they come in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rz_agents.deepseek_tokens import (
    ASSISTANT,
    BOS,
    DSML,
    DSML_CALLS_BLOCK,
    DSML_INVOKE_CLOSE,
    DSML_INVOKE_OPEN,
    DSML_PARAMETER_CLOSE,
    DSML_PARAMETER_OPEN,
    EOS,
    THINK_CLOSE,
    THINK_OPEN,
    USER,
)
from rz_agents.model.chat_messages import Message, call_function, check_tools, object_arguments, tool_calls_of
from rz_agents.model.chat_messages import check_messages as _check_messages
from rz_agents.model.chat_messages import message_content as _content
from rz_agents.model.deepseek_chat import DeepSeekEncoding

DSML_MODEL_TYPES = {"deepseek_v32": "v3.2", "deepseek_v4": "v4"}  # config.json model_type -> DSML version

_CALL_SHAPE = (
    '<{D}{block}>\n<{D}invoke name="${fn}">\n<{D}parameter name="$PARAMETER_NAME" string="true|false">'
    "$PARAMETER_VALUE</{D}parameter>\n...\n</{D}invoke>\n"
    '<{D}invoke name="${fn}2">\n...\n</{D}invoke>\n</{D}{block}>'
)

# The tools block each encoder appends to the system prompt (its TOOLS template, with the schemas as JSON).
_TOOLS_V32 = (
    "## Tools\n\nYou have access to a set of tools you can use to answer the user's question.\n"
    'You can invoke functions by writing a "<{D}function_calls>" block like the following as part of your '
    "reply to the user:\n" + _CALL_SHAPE.format(D=DSML, block="function_calls", fn="FUNCTION_NAME") + "\n\n"
    "String and scalar parameters should be specified as is without any escaping or quotes, while lists and "
    'objects should use JSON format. The "string" attribute should be set to "true" for string type '
    'parameters and "false" for other types (numbers, booleans, arrays, objects).\n\n'
    "If the thinking_mode is enabled, then after function results you should strongly consider outputting a "
    "thinking block. Here is an example:\n\n<{D}function_calls>\n...\n</{D}function_calls>\n\n"
    "<function_results>\n...\n</function_results>\n\n"
    f"{THINK_OPEN}...thinking about results{THINK_CLOSE}\n\n"
    "Here are the functions available in JSONSchema format:\n<functions>\n{schemas}\n</functions>\n"
).replace("{D}", DSML)

_TOOLS_V4 = (
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools "
    'by writing a "<{D}tool_calls>" block like the following:\n\n'
    + _CALL_SHAPE.format(D=DSML, block="tool_calls", fn="TOOL_NAME")
    + "\n\n"
    'String parameters should be specified as is and set `string="true"`. For all other types (numbers, '
    'booleans, arrays, objects), pass the value in JSON format and set `string="false"`.\n\n'
    f"If thinking_mode is enabled (triggered by {THINK_OPEN}), you MUST output your complete reasoning "
    f"inside {THINK_OPEN}...{THINK_CLOSE} BEFORE any tool calls or final response.\n\n"
    f"Otherwise, output directly after {THINK_CLOSE} with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n{schemas}\n\n"
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"
).replace("{D}", DSML)


def _tojson(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)  # the encoders' to_json


def render_dsml_call(call: Any, index: int) -> str:
    """One call as a ``<｜DSML｜invoke>`` element (the OpenAI or the bare ``{"name", "arguments"}`` shape;
    arguments as a dict or a JSON string): one parameter element per argument, strings written as they are."""
    name, arguments = call_function(call, index)
    params = []
    for key, value in object_arguments(arguments, name, index).items():
        text, is_str = (value, "true") if isinstance(value, str) else (_tojson(value), "false")
        params.append(f'{DSML_PARAMETER_OPEN} name="{key}" string="{is_str}">{text}{DSML_PARAMETER_CLOSE}')
    return f'{DSML_INVOKE_OPEN} name="{name}">\n' + "\n".join(params) + f"\n{DSML_INVOKE_CLOSE}"


def render_dsml_calls(calls: Sequence[Any], index: int, version: str) -> str:
    """An assistant turn's calls as the block that follows its answer after a blank line."""
    block = DSML_CALLS_BLOCK[version]
    invokes = "\n".join(render_dsml_call(call, index) for call in calls)
    return f"\n\n<{DSML}{block}>\n{invokes}\n</{DSML}{block}>"


def _tools_block(tools: Sequence[Mapping[str, Any]], version: str) -> str:
    check_tools(tools)
    schemas = "\n".join(_tojson(tool.get("function", tool)) for tool in tools)
    return (_TOOLS_V32 if version == "v3.2" else _TOOLS_V4).replace("{schemas}", schemas)


@dataclass(frozen=True)
class DsmlChatTemplate(DeepSeekEncoding):
    """DeepSeek-V3.2's (``version="v3.2"``) or V4's (``"v4"``) chat format with DSML tool calls, with
    `ChatTemplate`'s interface (render, encode_prompt, encode_continuation, stop_token_ids).
    ``enable_thinking`` is the encoders' ``thinking_mode="thinking"`` (off: ``"chat"``)."""

    tool_call_format = "dsml"  # tool calls as rz_agents.envs parses them (RenderedTemplate)

    version: str = "v4"

    def __post_init__(self) -> None:
        if self.version not in DSML_CALLS_BLOCK:
            raise ValueError(f"DSML version must be one of {sorted(DSML_CALLS_BLOCK)}, got {self.version!r}")

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool = True,
    ) -> str:
        """The conversation as prompt text (messages as for `ChatTemplate.render`; system messages first).
        ``add_generation_prompt=False`` leaves off the opening of the assistant's next turn."""
        _check_messages(messages)
        n_system = 0
        while n_system < len(messages) and messages[n_system]["role"] == "system":
            n_system += 1
        system = [_content(messages[i], i) for i in range(n_system)] or [""]
        if tools:
            system[0] += "\n\n" + _tools_block(tools, self.version)  # the encoders attach tools to message 0
        body = self._render_turns(messages, n_system, enable_thinking, add_generation_prompt)
        return BOS + "".join(system) + body

    def opening(self, previous: str, enable_thinking: bool = True) -> str:
        """What opens the assistant's turn after a turn of role `previous` (``user`` or ``tool``)."""
        think = THINK_OPEN if enable_thinking else THINK_CLOSE
        if previous == "tool" and self.version == "v3.2":
            return "\n\n" + think  # after </function_results>, with no header
        return ASSISTANT + think

    def generation_prompt(self, enable_thinking: bool = True) -> str:
        """What opens the assistant's turn after a user turn."""
        return self.opening("user", enable_thinking)

    def _render_turns(self, messages: Sequence[Message], start: int, thinking: bool, open_last: bool) -> str:
        parts: list[str] = []
        i = start
        while i < len(messages):
            role = messages[i]["role"]
            if role == "system":
                raise ValueError(
                    f"message {i}: DeepSeek's format puts every system message in front of the first turn; "
                    "a system message after other turns cannot be rendered append-only"
                )
            if role == "assistant":
                parts.append(self._assistant_turn(messages[i], i, thinking))
                i += 1
                continue
            end = i
            while end < len(messages) and messages[end]["role"] in ("user", "tool"):
                end += 1
            opens = end < len(messages) or open_last
            run = self._run_v32 if self.version == "v3.2" else self._run_v4
            parts.append(run(messages, i, end, thinking, opens))
            i = end
        return "".join(parts)

    def _run_v4(self, messages: Sequence[Message], start: int, end: int, thinking: bool, opens: bool) -> str:
        # V4 merges consecutive user and tool messages into one user turn.
        pieces = []
        for i in range(start, end):
            content = _content(messages[i], i)
            pieces.append(
                f"<tool_result>{content}</tool_result>" if messages[i]["role"] == "tool" else content
            )
        return USER + "\n\n".join(pieces) + (self.opening("user", thinking) if opens else "")

    def _run_v32(self, messages: Sequence[Message], start: int, end: int, thinking: bool, opens: bool) -> str:
        # V3.2 opens the assistant's turn after every user message and after every run of tool results.
        pieces: list[tuple[str, str]] = []  # (text, the opening that follows it)
        i = start
        while i < end:
            if messages[i]["role"] == "user":
                pieces.append((USER + _content(messages[i], i), self.opening("user", thinking)))
                i += 1
                continue
            results = []
            while i < end and messages[i]["role"] == "tool":
                results.append(f"\n<result>{_content(messages[i], i)}</result>")
                i += 1
            text = "\n\n<function_results>" + "".join(results) + "\n</function_results>"
            pieces.append((text, self.opening("tool", thinking)))
        text = "".join(body + after for body, after in pieces[:-1])
        return text + pieces[-1][0] + (pieces[-1][1] if opens else "")

    def _assistant_turn(self, message: Message, index: int, content_thinking: bool) -> str:
        content = _content(message, index)
        # In thinking mode the turn opened "<think>": the model writes its reasoning (maybe none), "</think>".
        reasoning = (message.get("reasoning_content") or "") + THINK_CLOSE if content_thinking else ""
        tool_calls = tool_calls_of(message, index)
        calls = render_dsml_calls(tool_calls, index, self.version) if tool_calls else ""
        return reasoning + content + calls + EOS

    def render_continuation(self, new_messages: Sequence[Message], enable_thinking: bool = True) -> str:
        """Text that follows an assistant turn's closing ``<｜end▁of▁sentence｜>``: the new turns + the
        opening of the assistant's next turn."""
        _check_messages(new_messages)
        if not new_messages:
            return self.generation_prompt(enable_thinking)
        return self._render_turns(new_messages, 0, enable_thinking, open_last=True)


DEEPSEEK_V32_CHAT_TEMPLATE = DsmlChatTemplate("v3.2")
DEEPSEEK_V4_CHAT_TEMPLATE = DsmlChatTemplate("v4")
