"""Parse tool calls out of a policy turn.

The Qwen3/Hermes format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any number
per turn. Optionally, fenced code blocks (```` ```python ... ``` ````) count as calls of a code
tool. Malformed calls never raise: each becomes a :class:`ToolCallError` with a message meant to
be shown to the policy, so the episode can continue.
"""

from __future__ import annotations

import json
import re
from typing import Any

from rz_agents.envs.base import ToolSpec
from rz_agents.envs.deepseek_tool_calls import is_deepseek_turn, parse_deepseek_tool_calls
from rz_agents.envs.dsml_tool_calls import is_dsml_turn, parse_dsml_tool_calls
from rz_agents.envs.kimi_tool_calls import is_kimi_turn, parse_kimi_tool_calls
from rz_agents.envs.tool_call_types import ParsedTurn, ToolCall, ToolCallError, tool_names, validate_call
from rz_agents.envs.xml_tool_calls import is_xml_call, parse_xml_call

__all__ = [
    "CLOSE",
    "OPEN",
    "ParsedTurn",
    "ToolCall",
    "ToolCallError",
    "format_tool_call",
    "parse_tool_calls",
    "tool_names",
    "validate_call",
]

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
_FENCE = re.compile(r"```(?:python|py)[ \t]*\n(.*?)(```|$)", re.DOTALL)


def _parse_call(body: str, schemas: dict[str, dict[str, Any]]) -> ToolCall | ToolCallError:
    if is_xml_call(body):  # Qwen3.5 / Qwen3-Coder: <function=NAME><parameter=KEY>...
        return parse_xml_call(body, schemas)
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        return ToolCallError(f"invalid JSON in <tool_call>: {exc.msg} at position {exc.pos}", body)
    except RecursionError:
        # json's decoder recurses once per nesting level: a few thousand levels exhaust the stack
        return ToolCallError("invalid JSON in <tool_call>: nested too deeply", body[:200])
    if not isinstance(obj, dict):
        return ToolCallError('a <tool_call> must hold a JSON object {"name": ..., "arguments": {...}}', body)
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        # some models emit arguments as a JSON-encoded string
        try:
            arguments = json.loads(arguments)
        except (json.JSONDecodeError, RecursionError):
            return ToolCallError('"arguments" must be a JSON object, got a string that is not JSON', body)
    problem = validate_call(obj.get("name"), arguments, schemas)
    if problem:
        return ToolCallError(problem, body)
    return ToolCall(obj["name"], arguments)


def parse_tool_calls(
    text: str, tools: list[ToolSpec], *, code_blocks: bool = False, code_tool: str = "python"
) -> ParsedTurn:
    """All tool calls in ``text`` (text inside ``<think>...</think>`` is ignored).

    ``tools`` are the env's tool specs. With ``code_blocks`` a fenced python block is a call of
    ``code_tool`` with ``{"code": ...}``. A turn in DeepSeek's format (``<｜tool▁calls▁begin｜>``) is parsed
    by `rz_agents.envs.deepseek_tool_calls` instead, one with DeepSeek-V3.2/V4 DSML elements by
    `rz_agents.envs.dsml_tool_calls`, one with Kimi's tool-call tokens by `rz_agents.envs.kimi_tool_calls`.
    A ``<tool_call>`` holding ``<function=NAME>`` (Qwen3.5's XML form) is read by
    `rz_agents.envs.xml_tool_calls`. Text before a ``</think>`` with no ``<think>`` (a turn that began after
    a generation prompt's ``<think>``) is reasoning, ignored too.
    """
    if is_kimi_turn(text):
        return parse_kimi_tool_calls(text, tools)
    if is_dsml_turn(text):
        return parse_dsml_tool_calls(text, tools)
    if is_deepseek_turn(text):
        return parse_deepseek_tool_calls(text, tools)
    schemas = tool_names(tools)
    visible = _THINK.sub("", text)
    if "</think>" in visible:  # reasoning opened by the generation prompt (Qwen3.5, Qwen3-Thinking-2507)
        visible = visible.split("</think>", 1)[1]
    found: list[tuple[int, ToolCall | ToolCallError]] = []
    pos = 0
    last_close = -1
    while True:
        start = visible.find(OPEN, pos)
        if start == -1:
            break
        end = visible.find(CLOSE, start + len(OPEN))
        nxt = visible.find(OPEN, start + len(OPEN))
        if end == -1 or (nxt != -1 and nxt < end):
            stop = len(visible) if nxt == -1 else nxt
            raw = visible[start:stop]
            found.append((start, ToolCallError("unterminated <tool_call> tag (missing </tool_call>)", raw)))
            pos = stop
            continue
        found.append((start, _parse_call(visible[start + len(OPEN) : end].strip(), schemas)))
        pos = last_close = end + len(CLOSE)
    if code_blocks:
        for m in _FENCE.finditer(visible):
            if any(s <= m.start() < s + len(getattr(i, "raw", "")) for s, i in found):
                continue
            if not m.group(2):
                found.append((m.start(), ToolCallError("unterminated ```python code block", m.group(0))))
            elif code_tool not in schemas:
                found.append((m.start(), ToolCallError(f"code blocks need a {code_tool!r} tool", m.group(0))))
            else:
                found.append((m.start(), ToolCall(code_tool, {"code": m.group(1)})))
    found.sort(key=lambda item: item[0])
    turn = ParsedTurn(items=[item for _, item in found])
    if last_close != -1:
        turn.trailing_text = visible[last_close:].strip()
    turn.calls = [i for i in turn.items if isinstance(i, ToolCall)]
    turn.errors = [i for i in turn.items if isinstance(i, ToolCallError)]
    return turn


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """Render one call in the Qwen3/Hermes format (used by scripted policies and tests)."""
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': arguments})}\n{CLOSE}"
