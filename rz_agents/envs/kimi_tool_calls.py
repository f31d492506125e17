"""Parse Kimi tool calls out of a policy turn.

The format (Kimi K2 / Kimi Linear's chat template; rendered by `rz_agents.model.kimi_chat`):
``<|tool_calls_section_begin|>`` + ``<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{json}``
``<|tool_call_end|>`` per call + ``<|tool_calls_section_end|>``. The tool's name is the call id without its
``functions.`` prefix and ``:IDX`` suffix. As for the other formats, malformed calls never raise: each becomes
a `ToolCallError` whose message is shown to the policy (truncated call, missing argument marker, bad JSON,
unknown tool, arguments against the schema); well-formed calls beside it are kept.
"""

from __future__ import annotations

from rz_agents.envs.base import ToolSpec
from rz_agents.envs.tool_call_types import (
    ParsedTurn,
    ToolCall,
    ToolCallError,
    json_call,
    parse_section,
    tool_names,
)
from rz_agents.kimi_tokens import (
    CALL_ID_PREFIX,
    TOOL_CALL_ARGUMENT_BEGIN,
    TOOL_CALL_BEGIN,
    TOOL_CALL_END,
    TOOL_CALLS_SECTION_BEGIN,
    TOOL_CALLS_SECTION_END,
)


def is_kimi_turn(text: str) -> bool:
    """True when `text` uses Kimi's tool-call tokens."""
    return TOOL_CALLS_SECTION_BEGIN in text or TOOL_CALL_BEGIN in text


def tool_name(call_id: str) -> str:
    """``functions.NAME:IDX`` -> ``NAME`` (an id without the prefix or the index is taken as it is)."""
    name = call_id.strip()
    name = name[len(CALL_ID_PREFIX) :] if name.startswith(CALL_ID_PREFIX) else name
    head, sep, index = name.rpartition(":")
    return head if sep and index.isdigit() else name


def _parse_one(body: str, schemas: dict) -> ToolCall | ToolCallError:
    call_id, sep, arguments_text = body.partition(TOOL_CALL_ARGUMENT_BEGIN)
    if not sep:
        return ToolCallError(
            "a tool call needs <|tool_call_argument_begin|> between its id and its JSON", body
        )
    return json_call(tool_name(call_id), arguments_text, body, schemas)


def parse_kimi_tool_calls(text: str, tools: list[ToolSpec]) -> ParsedTurn:
    """All Kimi-format tool calls in `text`, in order; reasoning before ``</think>`` is ignored."""
    schemas = tool_names(tools)
    return parse_section(
        text,
        (TOOL_CALLS_SECTION_BEGIN, TOOL_CALLS_SECTION_END, TOOL_CALL_BEGIN, TOOL_CALL_END),
        lambda body: _parse_one(body, schemas),
        "unterminated tool call (missing <|tool_call_end|>)",
        "tool calls section without a tool call",
    )
