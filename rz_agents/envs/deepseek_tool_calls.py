"""Parse DeepSeek-V3.1 tool calls out of a policy turn.

The format (DeepSeek-V3.1's chat template; rendered by `rz_agents.model.deepseek_chat`):
``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{json}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>``.
As for the Qwen format, malformed calls never raise: each becomes a `ToolCallError` whose message is shown to
the policy (truncated call, missing separator, bad JSON, unknown tool, arguments against the schema).
"""

from __future__ import annotations

import json

from rz_agents.deepseek_tokens import (
    THINK_CLOSE,
    TOOL_CALL_BEGIN,
    TOOL_CALL_END,
    TOOL_CALLS_BEGIN,
    TOOL_CALLS_END,
    TOOL_SEP,
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

_SHORT = {TOOL_CALL_BEGIN: "<tool_call_begin>", TOOL_CALL_END: "<tool_call_end>", TOOL_SEP: "<tool_sep>"}


def is_deepseek_turn(text: str) -> bool:
    """True when `text` uses DeepSeek's tool-call tokens."""
    return TOOL_CALLS_BEGIN in text or TOOL_CALL_BEGIN in text


def _parse_one(body: str, schemas: dict) -> ToolCall | ToolCallError:
    name, sep, arguments_text = body.partition(TOOL_SEP)
    if not sep:
        return ToolCallError(f"a tool call needs {_SHORT[TOOL_SEP]} between the tool name and its JSON", body)
    name = name.strip()
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


def parse_deepseek_tool_calls(text: str, tools: list[ToolSpec]) -> ParsedTurn:
    """All DeepSeek-format tool calls in `text`, in order; reasoning before ``</think>`` is ignored."""
    schemas = tool_names(tools)
    visible = text.split(THINK_CLOSE, 1)[1] if THINK_CLOSE in text else text
    message = f"unterminated tool call (missing {_SHORT[TOOL_CALL_END]})"
    turn, last_close = scan_calls(
        visible, TOOL_CALL_BEGIN, TOOL_CALL_END, lambda body: _parse_one(body, schemas), message
    )
    if not turn.items and TOOL_CALLS_BEGIN in visible:
        turn.items.append(ToolCallError("tool calls block without a tool call", visible))
        turn.errors = list(turn.items)
    if last_close != -1:
        turn.trailing_text = visible[last_close:].replace(TOOL_CALLS_END, "", 1).strip()
    return turn
