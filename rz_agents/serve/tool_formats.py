"""The tool-call formats ``rz serve`` reads replies in, one entry per format the chat templates name.

A chat template names the format its model writes calls in (``template.tool_call_format``; RenderedTemplate),
so the server never looks at the model family: the format says which special tokens the parser needs kept
when the reply is decoded, where the calls start (the content is the text before them, and after them),
the reply's start that ``tool_choice: "required"`` or a named function gives the model as context, how the
calls stream, and which call ids the reply carries. Every format parses with the envs' own parser
(``rz_agents.envs.tool_calls.parse_tool_calls``, which tells the formats apart by their markers).

- ``json``: Qwen3 / Hermes ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``;
- ``xml``: Qwen3.5 / Qwen3-Coder ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>...`` (xml_tool_stream.py);
- ``kimi``: Kimi's ``<|tool_calls_section_begin|>`` section of ``functions.NAME:IDX`` calls; the call ids
  the client gets are the ones the model wrote, so the history it sends back renders the same tokens;
- ``deepseek``, ``dsml``: parsed from the reply; not streamed piece by piece, and not forced (a 400).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rz_agents import deepseek_tokens as D
from rz_agents import kimi_tokens as K
from rz_agents.envs.tool_calls import CLOSE, OPEN, ToolCall, parse_tool_calls
from rz_agents.serve.openai_schema import OpenAIError
from rz_agents.serve.tool_stream import ToolCallStream, kimi_call_stream
from rz_agents.serve.xml_tool_stream import XmlCallStream

THINK_CLOSE = "</think>"
CLOSE_OPEN_THINK = "\n</think>\n\n"  # closes the think block a generation prompt opened, as an empty one
_KIMI_IDS = re.compile(re.escape(K.TOOL_CALL_BEGIN) + r"(.*?)" + re.escape(K.TOOL_CALL_ARGUMENT_BEGIN), re.S)


def _json_content(head: str, tail: str) -> str | None:
    return (head.rstrip() + ("\n" + tail.strip() if tail.strip() else "")).strip() or None


def _xml_content(head: str, tail: str) -> str | None:
    """Qwen3.5's template writes ``</think>\\n\\n`` before the calls (the reasoning's end): kept, so the
    message renders back to the tokens sampled."""
    head = head.rstrip()
    head += "\n\n" if head.endswith(THINK_CLOSE) else ""
    return (head + ("\n" + tail.strip() if tail.strip() else "")) or None


def _kimi_content(head: str, tail: str) -> str | None:
    """Kimi's template writes the content and the calls section with nothing between them: kept as is."""
    return (head + tail) or None


def _kimi_ids(text: str) -> list[str]:
    return [m.strip() for m in _KIMI_IDS.findall(text)]


@dataclass(frozen=True)
class ToolCallFormat:
    """What the server needs to know of one tool-call format (see the module docstring).

    ``forced`` maps (the named tool or None for "required", the conversation's calls so far) to the reply's
    start; None: forcing a call is refused for the format. ``stream`` builds a choice's call stream from the
    request's tools; None: calls come whole in the final delta. ``call_ids`` reads the model's own call ids
    from the reply (None: fresh ``call_...`` ids)."""

    name: str
    opening: str
    closing: str
    content: Callable[[str, str], str | None]
    kept_tokens: tuple[str, ...] = ()
    forced: Callable[[str | None, int], str] | None = None
    stream: Callable[[list[dict[str, Any]]], Any] | None = None
    call_ids: Callable[[str], list[str]] | None = None

    def forced_start(self, tool: str | None, calls_so_far: int, opens_think: bool) -> str:
        """The reply's start that forces a call (of ``tool``, or of any listed tool when None); after a
        generation prompt that opened a think block, the block is closed first (an empty one)."""
        if self.forced is None:
            choice = "a named function" if tool else "'required'"
            raise OpenAIError(
                f"tool_choice {choice} is not supported for the {self.name} tool-call format: use 'auto'",
                "tool_choice",
            )
        return (CLOSE_OPEN_THINK if opens_think else "") + self.forced(tool, calls_so_far)

    def reply(self, text: str, tools: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
        """(content, OpenAI ``tool_calls``) of a reply's text; no calls: the whole text is the content."""
        parsed = parse_tool_calls(text, tools)
        if not parsed.calls:
            return text, []
        reasoning_end = text.rfind(THINK_CLOSE)
        visible_from = reasoning_end + len(THINK_CLOSE) if reasoning_end >= 0 else 0
        cut = text.find(self.opening, visible_from)
        head = text[:cut] if cut >= 0 else text
        tail = text[text.rfind(self.closing) + len(self.closing) :] if self.closing in text else ""
        ids = self.call_ids(text[visible_from:]) if self.call_ids else []
        if len(ids) != len(parsed.items):
            ids = []  # a call the ids cannot be matched to: fresh ids for all
        calls = []
        for k, item in enumerate(parsed.items):
            if isinstance(item, ToolCall):
                arguments = json.dumps(item.arguments, ensure_ascii=False)
                calls.append(
                    {"id": ids[k] if ids else f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                     "function": {"name": item.name, "arguments": arguments}}
                )  # fmt: skip
        return self.content(head, tail), calls


def _json_forced(tool: str | None, calls_so_far: int) -> str:
    opening = f'{OPEN}\n{{"name": '
    return opening if tool is None else f'{opening}{json.dumps(tool)}, "arguments": '


def _xml_forced(tool: str | None, calls_so_far: int) -> str:
    return f"{OPEN}\n<function=" if tool is None else f"{OPEN}\n<function={tool}>\n"


def _kimi_forced(tool: str | None, calls_so_far: int) -> str:
    opening = f"{K.TOOL_CALLS_SECTION_BEGIN}{K.TOOL_CALL_BEGIN}{K.CALL_ID_PREFIX}"
    return opening if tool is None else f"{opening}{tool}:{calls_so_far}{K.TOOL_CALL_ARGUMENT_BEGIN}"


def _json_stream(tools: list[dict[str, Any]]) -> ToolCallStream:
    return ToolCallStream({t["function"]["name"] for t in tools})


def _kimi_stream(tools: list[dict[str, Any]]) -> ToolCallStream:
    return kimi_call_stream({t["function"]["name"] for t in tools})


_KIMI_TOKENS = (
    K.TOOL_CALLS_SECTION_BEGIN, K.TOOL_CALLS_SECTION_END, K.TOOL_CALL_BEGIN, K.TOOL_CALL_ARGUMENT_BEGIN,
    K.TOOL_CALL_END,
)  # fmt: skip
_DEEPSEEK_TOKENS = (D.TOOL_CALLS_BEGIN, D.TOOL_CALLS_END, D.TOOL_CALL_BEGIN, D.TOOL_CALL_END, D.TOOL_SEP)

FORMATS: dict[str, ToolCallFormat] = {
    "json": ToolCallFormat("json", OPEN, CLOSE, _json_content, (), _json_forced, _json_stream),
    "xml": ToolCallFormat("xml", OPEN, CLOSE, _xml_content, (), _xml_forced, XmlCallStream),
    "kimi": ToolCallFormat(
        "kimi",
        K.TOOL_CALLS_SECTION_BEGIN,
        K.TOOL_CALLS_SECTION_END,
        _kimi_content,
        _KIMI_TOKENS,
        _kimi_forced,
        _kimi_stream,
        _kimi_ids,
    ),  # fmt: skip
    "deepseek": ToolCallFormat(
        "deepseek", D.TOOL_CALLS_BEGIN, D.TOOL_CALLS_END, _json_content, _DEEPSEEK_TOKENS
    ),
    "dsml": ToolCallFormat("dsml", f"<{D.DSML}", "", _json_content),  # (no text after its calls block)
}


def format_of(template: Any) -> ToolCallFormat:
    """The tool-call format ``template`` names (``template.tool_call_format``); one it does not name, or an
    unknown name, is refused at start-up in one line."""
    name = getattr(template, "tool_call_format", None)
    if name not in FORMATS:
        raise ValueError(
            f"the chat template {type(template).__name__} names tool-call format {name!r}; "
            f"rz serve reads {sorted(FORMATS)}"
        )
    return FORMATS[name]
