"""Parse one tool call in the Qwen3-Coder XML form (Qwen3.5's chat template writes it; rendered by
`rz_agents.model.qwen3_5_chat`): inside ``<tool_call>...</tool_call>``,
``<function=NAME>`` + one ``<parameter=KEY>\\nVALUE\\n</parameter>`` per argument + ``</function>``.

Values are text; each is read by its parameter's JSON-schema type (a string as it is; integer, number and
boolean from their text, ``True`` / ``False`` as the template writes Python booleans; object and array as
JSON); an untyped value is JSON when it parses, else the text. Malformed calls never raise: each becomes a
`ToolCallError` whose message is shown to the policy (no ``<function=...>``, unterminated element, text
between parameters, duplicate argument, a value that does not fit its type, unknown tool, schema).
A string value cannot contain ``</parameter>`` (the format has no escape for it).
"""

from __future__ import annotations

import json
import re
from typing import Any

from rz_agents.envs.tool_call_types import ToolCall, ToolCallError, validate_call

FUNCTION_OPEN = "<function="
_FUNCTION_HEAD = re.compile(r"\s*<function=([^>\n]*)>")
_PARAM_HEAD = re.compile(r"<parameter=([^>\n]*)>")
_PARAM_CLOSE, _FUNCTION_CLOSE = "</parameter>", "</function>"


def is_xml_call(body: str) -> bool:
    """True when a ``<tool_call>`` body is in the XML form (else it is Qwen3's JSON form)."""
    return body.lstrip().startswith(FUNCTION_OPEN)


def typed_value(name: str, key: str, text: str, schema: dict[str, Any]) -> tuple[Any, str | None]:
    """The value of argument `key` read by its schema type, or what is wrong with it."""
    kind = schema.get("properties", {}).get(key, {}).get("type")
    try:
        if kind == "string":
            return text, None
        if kind == "integer":
            return int(text.strip()), None
        if kind == "number":
            number = float(text.strip())
            return (int(number) if number.is_integer() and "." not in text else number), None
        if kind == "boolean":
            lowered = text.strip().lower()
            if lowered in ("true", "false"):
                return lowered == "true", None
            return None, f"argument {key!r} of {name!r} must be true or false, got {text.strip()[:40]!r}"
        return json.loads(text), None
    except ValueError:
        if kind in (None, "") or not isinstance(kind, str):
            return text, None  # untyped: the text itself
        return None, f"argument {key!r} of {name!r} must be of type {kind}, got {text.strip()[:40]!r}"
    except RecursionError:
        return None, f"argument {key!r} of {name!r}: JSON nested too deeply"


def _arguments(name: str, inner: str, schema: dict[str, Any]) -> dict[str, Any] | str:
    """The arguments between ``<function=NAME>`` and ``</function>``, or what is wrong with them."""
    arguments: dict[str, Any] = {}
    pos = 0
    while (start := inner.find("<parameter=", pos)) != -1:
        if inner[pos:start].strip():
            return f"unexpected text between the parameters of {name!r}: {inner[pos:start].strip()[:80]!r}"
        head = _PARAM_HEAD.match(inner, start)
        if head is None:
            return f"a parameter of {name!r} needs <parameter=NAME>"
        end = inner.find(_PARAM_CLOSE, head.end())
        if end == -1:
            return f"unterminated parameter {head.group(1)!r} of {name!r} (missing </parameter>)"
        key = head.group(1).strip()
        if key in arguments:
            return f"duplicate argument {key!r} in the call of {name!r}"
        text = inner[head.end() : end]
        text = text[1:] if text.startswith("\n") else text  # the template puts the value on its own line
        text = text[:-1] if text.endswith("\n") else text
        value, problem = typed_value(name, key, text, schema)
        if problem:
            return problem
        arguments[key] = value
        pos = end + len(_PARAM_CLOSE)
    if inner[pos:].strip():
        return f"unexpected text in the call of {name!r}: {inner[pos:].strip()[:80]!r}"
    return arguments


def parse_xml_call(body: str, schemas: dict[str, dict[str, Any]]) -> ToolCall | ToolCallError:
    """One call from the text between ``<tool_call>`` and ``</tool_call>``."""
    head = _FUNCTION_HEAD.match(body)
    if head is None:
        return ToolCallError("a tool call needs <function=NAME> after <tool_call>", body)
    name = head.group(1).strip()
    end = body.find(_FUNCTION_CLOSE, head.end())
    if end == -1:
        return ToolCallError(f"unterminated <function={name}> (missing </function>)", body)
    if body[end + len(_FUNCTION_CLOSE) :].strip():
        extra = body[end + len(_FUNCTION_CLOSE) :].strip()[:80]
        return ToolCallError(f"unexpected text after </function> in the call of {name!r}: {extra!r}", body)
    arguments = _arguments(name, body[head.end() : end], schemas.get(name, {}))
    if isinstance(arguments, str):
        return ToolCallError(arguments, body)
    problem = validate_call(name, arguments, schemas)
    if problem:
        return ToolCallError(problem, body)
    return ToolCall(name, arguments)
