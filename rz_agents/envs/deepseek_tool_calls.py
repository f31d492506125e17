"""Parse DeepSeek-V3.1 tool calls out of a policy turn.

The format (DeepSeek-V3.1's chat template; rendered by `rz_agents.model.deepseek_chat`):
``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{json}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>``.
As for the Qwen format, malformed calls never raise: each becomes a `ToolCallError` whose message is shown to
the policy (truncated call, missing separator, bad JSON, unknown tool, arguments against the schema).
"""

from __future__ import annotations

from rz_agents.deepseek_tokens import (
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
    json_call,
    parse_section,
    tool_names,
)

_SHORT = {TOOL_CALL_BEGIN: "<tool_call_begin>", TOOL_CALL_END: "<tool_call_end>", TOOL_SEP: "<tool_sep>"}


def is_deepseek_turn(text: str) -> bool:
    """True when `text` uses DeepSeek's tool-call tokens."""
    return TOOL_CALLS_BEGIN in text or TOOL_CALL_BEGIN in text


def _parse_one(body: str, schemas: dict) -> ToolCall | ToolCallError:
    name, sep, arguments_text = body.partition(TOOL_SEP)
    if not sep:
        return ToolCallError(f"a tool call needs {_SHORT[TOOL_SEP]} between the tool name and its JSON", body)
    return json_call(name.strip(), arguments_text, body, schemas)


def parse_deepseek_tool_calls(text: str, tools: list[ToolSpec]) -> ParsedTurn:
    """All DeepSeek-format tool calls in `text`, in order; reasoning before ``</think>`` is ignored."""
    schemas = tool_names(tools)
    return parse_section(
        text,
        (TOOL_CALLS_BEGIN, TOOL_CALLS_END, TOOL_CALL_BEGIN, TOOL_CALL_END),
        lambda body: _parse_one(body, schemas),
        f"unterminated tool call (missing {_SHORT[TOOL_CALL_END]})",
        "tool calls block without a tool call",
    )
