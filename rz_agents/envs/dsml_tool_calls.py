"""Parse DeepSeek-V3.2 / V4 DSML tool calls out of a policy turn.

The format (their published encoders; rendered by `rz_agents.model.deepseek_dsml`): a block
``<｜DSML｜function_calls>`` (V3.2) or ``<｜DSML｜tool_calls>`` (V4) of
``<｜DSML｜invoke name="NAME">`` elements, each holding one
``<｜DSML｜parameter name="KEY" string="true|false">VALUE</｜DSML｜parameter>`` per argument: ``true`` takes
VALUE as it is, ``false`` as JSON. Both block names are read. Malformed calls never raise: each becomes a
`ToolCallError` whose message is shown to the policy (unterminated element, bad header, bad JSON value,
duplicate argument, unknown tool, arguments against the schema); well-formed calls beside it are kept.
A string argument cannot contain ``</｜DSML｜parameter>`` (the format has no escape for it).
"""

from __future__ import annotations

import json
import re
from typing import Any

from rz_agents.deepseek_tokens import (
    DSML,
    DSML_CALLS_BLOCK,
    DSML_INVOKE_CLOSE,
    DSML_INVOKE_OPEN,
    DSML_PARAMETER_CLOSE,
    DSML_PARAMETER_OPEN,
    THINK_CLOSE,
)
from rz_agents.envs.base import ToolSpec
from rz_agents.envs.tool_call_types import (
    ParsedTurn,
    ToolCall,
    ToolCallError,
    scan_calls,
    tool_names,
    validate_call,
)

_INVOKE_HEAD = re.compile(r'\s+name="([^"\n]*)"\s*>\n?')
_PARAM_HEAD = re.compile(r'\s+name="([^"\n]*)"\s+string="(true|false)"\s*>')
_BLOCK_TAGS = [f"<{DSML}{b}>" for b in DSML_CALLS_BLOCK.values()] + [
    f"</{DSML}{b}>" for b in DSML_CALLS_BLOCK.values()
]


def is_dsml_turn(text: str) -> bool:
    """True when `text` uses DeepSeek's DSML tool-call elements."""
    return DSML in text


def _value(name: str, key: str, is_str: str, raw: str) -> tuple[Any, str | None]:
    if is_str == "true":
        return raw, None
    try:
        return json.loads(raw), None
    except json.JSONDecodeError as exc:
        problem = f'argument {key!r} of {name!r} has string="false" but its value is not JSON: {exc.msg}'
        return None, problem
    except RecursionError:
        return None, f"argument {key!r} of {name!r}: JSON nested too deeply"


def _parse_arguments(name: str, body: str) -> dict[str, Any] | str:
    """The arguments in an invoke's body, or what is wrong with them."""
    arguments: dict[str, Any] = {}
    pos = 0
    while True:
        start = body.find(DSML_PARAMETER_OPEN, pos)
        if start == -1:
            break
        if body[pos:start].strip():
            return f"unexpected text between the parameters of {name!r}: {body[pos:start].strip()[:80]!r}"
        head = _PARAM_HEAD.match(body, start + len(DSML_PARAMETER_OPEN))
        if head is None:
            return f'a parameter of {name!r} needs name="..." string="true|false">'
        end = body.find(DSML_PARAMETER_CLOSE, head.end())
        if end == -1:
            return f"unterminated parameter {head.group(1)!r} of {name!r} (missing </DSML parameter>)"
        key = head.group(1)
        if key in arguments:
            return f"duplicate argument {key!r} in the call of {name!r}"
        value, problem = _value(name, key, head.group(2), body[head.end() : end])
        if problem:
            return problem
        arguments[key] = value
        pos = end + len(DSML_PARAMETER_CLOSE)
    if body[pos:].strip():
        return f"unexpected text in the call of {name!r}: {body[pos:].strip()[:80]!r}"
    return arguments


def _parse_invoke(element: str, schemas: dict) -> ToolCall | ToolCallError:
    """One ``<｜DSML｜invoke ...>...</｜DSML｜invoke>`` element's text between the tags."""
    head = _INVOKE_HEAD.match(element)
    if head is None:
        return ToolCallError('an invoke needs a name: <DSML invoke name="TOOL">', element)
    name = head.group(1)
    arguments = _parse_arguments(name, element[head.end() :])
    if isinstance(arguments, str):
        return ToolCallError(arguments, element)
    problem = validate_call(name, arguments, schemas)
    if problem:
        return ToolCallError(problem, element)
    return ToolCall(name, arguments)


def parse_dsml_tool_calls(text: str, tools: list[ToolSpec]) -> ParsedTurn:
    """All DSML tool calls in `text`, in order; reasoning before ``</think>`` is ignored."""
    schemas = tool_names(tools)
    visible = text.split(THINK_CLOSE, 1)[1] if THINK_CLOSE in text else text
    turn, last_close = scan_calls(
        visible,
        DSML_INVOKE_OPEN,
        DSML_INVOKE_CLOSE,
        lambda body: _parse_invoke(body, schemas),
        "unterminated invoke (missing </DSML invoke>)",
    )
    if not turn.items and DSML in visible:
        turn.items.append(ToolCallError("DSML tool calls block without an invoke element", visible))
        turn.errors = list(turn.items)
    if last_close != -1:
        trailing = visible[last_close:]
        for tag in _BLOCK_TAGS:
            trailing = trailing.replace(tag, "", 1)
        turn.trailing_text = trailing.strip()
    return turn
