"""What a tool-call parser returns (calls, errors shown to the policy, the parsed turn) and the schema check
every format shares; the Qwen3/Hermes parser (`tool_calls`) and DeepSeek's (`deepseek_tool_calls`) use it."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rz_agents.envs.base import ToolSpec

_JSON_TYPES = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "object": dict,
    "array": list,
}


@dataclass
class ToolCall:
    """One well-formed call of a known tool."""

    name: str
    arguments: dict[str, Any]


@dataclass
class ToolCallError:
    """A malformed call; ``message`` is what the policy gets back."""

    message: str
    raw: str = ""


@dataclass
class ParsedTurn:
    """The calls of one turn, in order of appearance (errors listed separately)."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[ToolCallError] = field(default_factory=list)
    items: list[ToolCall | ToolCallError] = field(default_factory=list)  # both, in text order
    # visible text after the last closed </tool_call> (stray closing tags, commentary), stripped
    trailing_text: str = ""

    @property
    def has_calls(self) -> bool:
        """True when the turn tried to call a tool at all (well-formed or not)."""
        return bool(self.items)


def tool_names(tools: list[ToolSpec]) -> dict[str, dict[str, Any]]:
    """Map tool name -> its JSON-schema ``parameters`` from OpenAI/Qwen3 function specs."""
    out = {}
    for spec in tools:
        fn = spec.get("function", spec)
        out[fn["name"]] = fn.get("parameters") or {"type": "object", "properties": {}}
    return out


def validate_call(name: Any, arguments: Any, schemas: dict[str, dict[str, Any]]) -> str | None:
    """What is wrong with a call of `name` with `arguments` against the tools' schemas (None: nothing)."""
    if not isinstance(name, str) or not name:
        return 'the call needs a "name" string'
    if name not in schemas:
        return f"unknown tool {name!r}; available: {', '.join(sorted(schemas)) or 'none'}"
    if not isinstance(arguments, dict):
        return f'"arguments" of {name} must be a JSON object'
    schema = schemas[name]
    props = schema.get("properties", {})
    missing = [k for k in schema.get("required", []) if k not in arguments]
    if missing:
        return f"{name} is missing required argument(s): {', '.join(missing)}"
    unknown = [k for k in arguments if props and k not in props]
    if unknown:
        return f"{name} got unexpected argument(s): {', '.join(unknown)}; expected: {', '.join(props)}"
    for key, value in arguments.items():
        expected = _JSON_TYPES.get(props.get(key, {}).get("type", ""))
        if expected and (
            not isinstance(value, expected) or (expected is not bool and isinstance(value, bool))
        ):
            return f"argument {key!r} of {name} must be of type {props[key]['type']}"
    return None


def json_call(
    name: str, arguments_text: str, body: str, schemas: dict[str, dict[str, Any]]
) -> ToolCall | ToolCallError:
    """A call of `name` whose arguments are the JSON object `arguments_text`, or what is wrong with it (bad
    JSON, against the schema); `body` is the call's raw text for the error."""
    try:
        arguments = json.loads(arguments_text)
    except json.JSONDecodeError as exc:
        return ToolCallError(f"invalid JSON arguments for {name!r}: {exc.msg} at position {exc.pos}", body)
    except RecursionError:
        return ToolCallError(f"invalid JSON arguments for {name!r}: nested too deeply", body[:200])
    problem = validate_call(name, arguments, schemas)
    if problem:
        return ToolCallError(problem, body)
    return ToolCall(name, arguments)


def parse_section(
    text: str,
    markers: tuple[str, str, str, str],
    parse: Callable[[str], ToolCall | ToolCallError],
    unterminated: str,
    empty: str,
) -> ParsedTurn:
    """The calls of a turn in a token-delimited format: `markers` are (section begin, section end, call begin,
    call end); reasoning before ``</think>`` is ignored; each call's text goes to `parse`; a section with no
    call is one `ToolCallError` (`empty`); text after the last call (section end removed) is trailing."""
    section_begin, section_end, call_begin, call_end = markers
    visible = text.split("</think>", 1)[1] if "</think>" in text else text
    turn, last_close = scan_calls(visible, call_begin, call_end, parse, unterminated)
    if not turn.items and section_begin in visible:
        turn.items.append(ToolCallError(empty, visible))
        turn.errors = list(turn.items)
    if last_close != -1:
        turn.trailing_text = visible[last_close:].replace(section_end, "", 1).strip()
    return turn


def scan_calls(
    visible: str,
    open_tag: str,
    close_tag: str,
    parse: Callable[[str], ToolCall | ToolCallError],
    unterminated: str,
) -> tuple[ParsedTurn, int]:
    """Every ``open_tag ... close_tag`` element of `visible`, in order, each given to `parse` (the text from
    the open tag's end to the close tag); one opened again before it closes, or never closed, is a
    `ToolCallError` with the `unterminated` message. Returns the turn (calls and errors sorted out) and where
    the last closed element ends (-1: none), for the caller's trailing text."""
    turn = ParsedTurn()
    pos, last_close = 0, -1
    while True:
        start = visible.find(open_tag, pos)
        if start == -1:
            break
        body_at = start + len(open_tag)
        end = visible.find(close_tag, body_at)
        nxt = visible.find(open_tag, body_at)
        if end == -1 or (nxt != -1 and nxt < end):
            stop = len(visible) if nxt == -1 else nxt
            turn.items.append(ToolCallError(unterminated, visible[start:stop]))
            pos = stop
            continue
        turn.items.append(parse(visible[body_at:end]))
        pos = last_close = end + len(close_tag)
    turn.calls = [i for i in turn.items if isinstance(i, ToolCall)]
    turn.errors = [i for i in turn.items if isinstance(i, ToolCallError)]
    return turn, last_close
