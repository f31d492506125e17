"""Qwen3.5's chat format (ChatML, tools in the Qwen3-Coder XML form, always a think block), append-only.

Rendering follows the official jinja ``chat_template`` of the Qwen3.5 checkpoints (dense, MoE and
vision-language share it) for everything the model sees:

- the tools block opens the system prompt (``# Tools ... <tools>`` one JSON schema a line ``</tools>`` and
  the call instructions), the system message follows it after a blank line; only the first message may be
  a system message; system, user and tool texts are stripped of surrounding whitespace, as the jinja's
  ``|trim`` does;
- an assistant tool call is ``<tool_call>\\n<function=NAME>\\n`` + one
  ``<parameter=KEY>\\nVALUE\\n</parameter>\\n`` per argument + ``</function>\\n</tool_call>``: strings as they
  are, objects and lists as JSON, other values as Python's ``str`` (the jinja's ``|string``: ``True``, ``3``);
  the first call follows the answer after a blank line, later ones after a newline;
- consecutive tool results share one user turn of ``<tool_response>`` blocks;
- the generation prompt opens a think block: ``<think>\\n`` (thinking) or the empty
  ``<think>\\n\\n</think>\\n\\n`` (``enable_thinking=False``).

One deliberate difference makes rendering append-only (rollouts never re-tokenize): an assistant turn renders
the same wherever it sits. The official template drops the think block of assistant turns before the last
user query; here every turn keeps it: ``<think>\\n{reasoning}\\n</think>\\n\\n{answer}`` from
``reasoning_content``, ``<think>\\n`` + the content as the model wrote it when the content holds ``</think>``
(the model writes after the generation prompt's ``<think>\\n``), else the empty think block + the content.
For turns after the last user query (the agent case: one task, many tool rounds) the two agree token for
token. Not rendered: images and videos (model/vision parts), ``add_vision_id``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rz_agents.model.chat_messages import (
    Message,
    RenderedTemplate,
    TextEncoder,
    call_function,
    check_tools,
    object_arguments,
    required_id,
    stop_ids,
    tool_calls_of,
)
from rz_agents.model.chat_messages import check_messages as _check_messages
from rz_agents.model.chat_messages import message_content as _content

IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
OPEN_THINK, THINK_CLOSE = "<think>\n", "</think>"
EMPTY_THINK = "<think>\n\n</think>\n\n"
QWEN3_5_MODEL_TYPES = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")

TOOLS_HEADER = "# Tools\n\nYou have access to the following functions:\n\n<tools>"
TOOLS_FOOTER = (
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\n"
    "multiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block must be "
    "nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the function "
    "call, but NOT after\n- If there is no function call available, answer the question like normal with "
    "your current knowledge and do not tell the user about function calls\n</IMPORTANT>"
)


def _tojson(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)  # transformers' `tojson` filter


def parameter_text(value: Any) -> str:
    """An argument's value as the template writes it: JSON for objects and lists, else ``str(value)``."""
    if isinstance(value, (Mapping, list, tuple)):
        return _tojson(value)
    return str(value)


def render_xml_call(name: str, arguments: Mapping[str, Any]) -> str:
    """One call in the Qwen3-Coder XML form."""
    params = "".join(
        f"<parameter={key}>\n{parameter_text(value)}\n</parameter>\n" for key, value in arguments.items()
    )
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


@dataclass(frozen=True)
class Qwen35ChatTemplate(RenderedTemplate):
    """Qwen3.5's chat format with `ChatTemplate`'s interface (render, render_continuation, encode_prompt,
    encode_continuation, stop_token_ids); see the module docstring."""

    tool_call_format = "xml"  # tool calls as rz_agents.envs parses them (RenderedTemplate)

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool = True,
    ) -> str:
        """The conversation as prompt text (messages as for `ChatTemplate.render`)."""
        _check_messages(messages)
        start = 1 if messages and messages[0]["role"] == "system" else 0
        text = self._system_header(messages, tools) + self._render_turns(messages, start)
        return text + (self.generation_prompt(enable_thinking) if add_generation_prompt else "")

    def generation_prompt(self, enable_thinking: bool = True) -> str:
        """The assistant header and the opened (thinking) or empty think block."""
        return f"{IM_START}assistant\n" + (OPEN_THINK if enable_thinking else EMPTY_THINK)

    def render_continuation(self, new_messages: Sequence[Message], enable_thinking: bool = True) -> str:
        """Text that follows an assistant turn's closing ``<|im_end|>``: the new turns + generation prompt."""
        _check_messages(new_messages)
        return "\n" + self._render_turns(new_messages, 0) + self.generation_prompt(enable_thinking)

    def _system_header(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None) -> str:
        system = _content(messages[0], 0).strip() if messages and messages[0]["role"] == "system" else None
        if tools:
            check_tools(tools)
            body = TOOLS_HEADER + "".join("\n" + _tojson(tool) for tool in tools) + TOOLS_FOOTER
            return f"{IM_START}system\n{body}" + (f"\n\n{system}" if system else "") + f"{IM_END}\n"
        return "" if system is None else f"{IM_START}system\n{system}{IM_END}\n"

    def _render_turns(self, messages: Sequence[Message], start: int) -> str:
        parts: list[str] = []
        for i in range(start, len(messages)):
            role = messages[i]["role"]
            content = _content(messages[i], i)
            if role == "system":
                raise ValueError(
                    f"message {i}: Qwen3.5's template takes a system message only as the first one"
                )
            if role == "user":
                parts.append(f"{IM_START}user\n{content.strip()}{IM_END}\n")
            elif role == "assistant":
                parts.append(self._render_assistant(messages[i], i, content))
            else:  # tool: consecutive results share one user turn
                if i == 0 or messages[i - 1]["role"] != "tool":
                    parts.append(f"{IM_START}user")
                parts.append(f"\n<tool_response>\n{content.strip()}\n</tool_response>")
                if i == len(messages) - 1 or messages[i + 1]["role"] != "tool":
                    parts.append(f"{IM_END}\n")
        return "".join(parts)

    def _render_assistant(self, message: Message, index: int, content: str) -> str:
        reasoning = message.get("reasoning_content")
        answer = content.split(THINK_CLOSE)[-1]
        if isinstance(reasoning, str):
            answer = content.strip()
            body = f"{OPEN_THINK}{reasoning.strip()}\n{THINK_CLOSE}\n\n{answer}"
        elif THINK_CLOSE in content:
            body = OPEN_THINK + content  # what the model wrote after the generation prompt's <think>
        else:
            answer = content.strip()
            body = EMPTY_THINK + answer
        for k, call in enumerate(tool_calls_of(message, index)):
            name, arguments = call_function(call, index)
            body += ("\n\n" if answer.strip() else "") if k == 0 else "\n"
            body += render_xml_call(name, object_arguments(arguments, name, index))
        return f"{IM_START}assistant\n{body}{IM_END}\n"

    def turn_end_id(self, tokenizer: TextEncoder) -> int:
        """``<|im_end|>``, as for ChatML (`ChatTemplate.turn_end_id`)."""
        return required_id(tokenizer, IM_END)

    def stop_token_ids(self, tokenizer: TextEncoder) -> list[int]:
        """Ids that end an assistant turn: ``<|im_end|>``, then ``<|endoftext|>`` if the vocabulary has it."""
        return stop_ids(tokenizer, IM_END, [END_OF_TEXT], "ChatML")


QWEN3_5_CHAT_TEMPLATE = Qwen35ChatTemplate()
